"""The rules of the keys that place layers on pipeline stages, as Megatron-Core refuses them.

Megatron-Core's TransformerConfig.__post_init__ (megatron/core/transformer/transformer_config.py)
refuses: num_layers_in_first/last_pipeline_stage together with either account flag; a
pipeline layout together with any of them; a layout whose stage count is not a multiple of pp
or whose vp disagrees; with the account flags, L + E + L' not divisible by pp, or its share per
rank not by vp; with the uneven split, the middle layers not divisible by the middle ranks, or
their share by vp. Each refusal here is one line.
"""

from __future__ import annotations

from traces.errors import ConfigError, show
from traces.fields import check_bool, check_int
from traces.model import MAX_DIMS
from traces.pipeline_layout import FIELD
from traces.stage_split import Split


def check_split_keys(split: Split) -> None:
    """The rules that need no model: types, exclusions, the layout string and its stage count
    (`split.layers` is not read)."""
    _check_end_counts(split)
    check_bool(split.embedding, "parallel.account_for_embedding")
    check_bool(split.loss, "parallel.account_for_loss")
    if not isinstance(split.layout, str):
        raise ConfigError(f"{FIELD}: {show(split.layout)} must be a string such as "
                          "\"Et|(tt|)*30L\"")
    if split.uneven and (split.embedding or split.loss):
        raise ConfigError("parallel.account_for_embedding, parallel.account_for_loss: cannot "
                          "be set with pp_first_layers / pp_last_layers (Megatron-Core refuses "
                          "the account flags with an uneven first or last stage)")
    if not split.layout:
        return
    if split.uneven or split.embedding or split.loss:
        raise ConfigError(f"{FIELD}: cannot be set with pp_first_layers, pp_last_layers, "
                          "account_for_embedding or account_for_loss (Megatron-Core refuses a "
                          "pipeline layout with other pipeline layout arguments)")
    stages = len(split.stages() or ())
    if stages != split.pp * split.vp:
        raise ConfigError(f"{FIELD}: {stages} virtual stages, but pp x vp = {split.pp} x "
                          f"{split.vp} = {split.pp * split.vp} (the layout lists every virtual "
                          "stage; Megatron-Core takes vp = stages / pp)")


def check_split(split: Split) -> None:
    """The rules that tie the split to the model's layer count (`check_split_keys` passed)."""
    if split.layout:
        found = sum(s.layers for s in split.stages() or ())
        if found != split.layers:
            raise ConfigError(f"{FIELD}: {found} transformer layers (t), but model.layers = "
                              f"{split.layers}")
        _check_mtp(split)
        return
    if split.embedding or split.loss:
        _check_accounted(split)
        return
    if split.uneven:
        _check_uneven(split)
        return
    if split.layers % (split.pp * split.vp):
        raise ConfigError(f"model.layers: {split.layers} is not divisible by pp x vp = "
                          f"{split.pp} x {split.vp} = {split.pp * split.vp} stages")


def _check_mtp(split: Split) -> None:
    """`m` as many times as model.mtp_layers, all in the virtual stage of the loss: Megatron-
    Core's validate_layer_layout keeps them in one stage, its rank's last chunk; its standalone
    MTP stage (on another rank than the loss) is not modelled."""
    stages = split.stages() or ()
    found = sum(s.mtp for s in stages)
    if found != split.mtp:
        raise ConfigError(f"{FIELD}: {found} MTP layers (m), but model.mtp_layers = "
                          f"{split.mtp}")
    elsewhere = [k for k, s in enumerate(stages[:-1]) if s.mtp]
    if elsewhere:
        raise ConfigError(f"{FIELD}: 'm' in virtual stage {elsewhere[0]}: MTP layers must be "
                          f"in the last virtual stage {len(stages) - 1}, with the loss L "
                          "(Megatron-Core's standalone MTP stage is not modelled)")


def _check_accounted(split: Split) -> None:
    """L + E + L' split evenly over the pp ranks, and each rank's share over its vp chunks."""
    names = " + ".join(["model.layers", *(["embedding"] if split.embedding else []),
                        *(["loss"] if split.loss else [])])
    total, pp, vp = split.accounted, split.pp, split.vp
    if total % pp:
        raise ConfigError(f"parallel.account_for_embedding, parallel.account_for_loss: "
                          f"{names} = {total} is not divisible by pp = {pp}")
    if (total // pp) % vp:
        raise ConfigError(f"parallel.account_for_embedding, parallel.account_for_loss: "
                          f"{names} = {total} over pp = {pp} is {total // pp} a rank, not "
                          f"divisible by vp = {vp}")
    # total >= 1 and divisible by pp x vp: every stage has one place, so Megatron-Core's
    # 'not enough layers in the first (last) virtual pipeline stage' cannot happen here


def _check_uneven(split: Split) -> None:
    """pp_first_layers / pp_last_layers: whole layers per chunk of the other ranks."""
    ranks = split.pp - (split.first > 0) - (split.last > 0)
    middle = split.layers - split.first - split.last
    text = (f"model.layers {split.layers} - parallel.pp_first_layers {split.first} - "
            f"parallel.pp_last_layers {split.last}")
    if middle < 0 or (ranks == 0 and middle):
        raise ConfigError(f"parallel.pp_first_layers, parallel.pp_last_layers: {text} = "
                          f"{middle} layers are left for the {ranks} other pipeline ranks")
    if ranks and (middle == 0 or middle % (ranks * split.vp)):
        raise ConfigError(f"parallel.pp_first_layers, parallel.pp_last_layers: {text} = "
                          f"{middle} layers do not split evenly into at least one per chunk "
                          f"over the other {ranks} pipeline ranks x vp {split.vp}")


def _check_end_counts(split: Split) -> None:
    """pp_first_layers / pp_last_layers: counts of whole layers per chunk of their rank."""
    for name, value in (("pp_first_layers", split.first), ("pp_last_layers", split.last)):
        check_int(value, f"parallel.{name}", minimum=0, maximum=MAX_DIMS["layers"])
        if value and split.pp < 2:
            raise ConfigError(f"parallel.{name}: {value} needs pp >= 2 (with one pipeline "
                              "rank there is no first or last stage to lighten)")
        if value % split.vp:
            raise ConfigError(f"parallel.{name}: {value} is not divisible by vp = "
                              f"{split.vp} (each model chunk of the rank takes {name}/vp "
                              "layers, as in Megatron-Core)")
