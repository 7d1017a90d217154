"""Front doors: other projects' descriptions of a job read into parasim's own config.

`hf` reads a Hugging Face `config.json` into `[model]` (`--model hf:PATH`, `[model] from =
"hf:PATH"`: `model_source`); `megatron` turns a Megatron-LM / Megatron-Bridge argument list into
a parasim TOML (`parasim from-megatron`). Each names what it cannot express instead of guessing.
"""
