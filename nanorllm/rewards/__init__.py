"""Every reward source, one home (docs/rewards.md), each registered once in `sources.py` (its flags, its spec type and how a
spec becomes its sources; the config reads the specs off its groups and the env assembly builds them, neither
naming any source): `functions.py`
(--reward functions, and RewardSources: how a run's sources score a batch of episodes, and the rule that a failed
score is no zero), `model.py` + `norm.py` (a learned --reward-model), `judge.py` + `rubric.py` (an LLM --judge). A
source has a name, a spec, a weight and a call returning one float, None or NaN per episode; the config imports
each file for its flags. Below envs/: envs/scored.py wraps an env bundle with the sources."""
