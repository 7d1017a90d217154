"""`parasim sweep`: one config simulated once per value of one key (`points`), and its plotly
report (`report`)."""
