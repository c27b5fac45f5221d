"""Every reward source, one home (docs/rewards.md), each registered once in `sources.py` (its spec type and how a
spec becomes its sources; the env assembly builds the specs a run names without naming any source): `functions.py`
(--reward functions, and RewardSources: how a run's sources score a batch of episodes, and the rule that a failed
score is no zero), `model.py` + `norm.py` (a learned --reward-model), `judge.py` + `rubric.py` (an LLM --judge). A
source has a name, a spec, a weight and a call returning one float, None or NaN per episode; each file is imported
only when a run names it. Below envs/: envs/scored.py wraps an env bundle with the sources."""
