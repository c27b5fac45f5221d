"""The supervised programs, beside the RL run: fitting a reward model (`fit.py` on `data.py`'s rows, which
`labels.py` can sample from a policy). A program on top: it reads the config's checks, the rewards it fits for and
the envs it samples, and nothing below imports it."""
