"""Prompts and rewards; imports no other part of sparrow.

generators.py      the embedded, seeded task generator (arithmetic, long-context lookup, chain)
chain.py           the long-generation task: an addition chain worked out line by line
data.py            DataConfig, prompt datasets (embedded, JSONL, HF), the batch iterator
rewards.py         the reward interface, registry, the guard and batch scoring
reward_result.py   what a reward returns, and its timeout
math_verifier.py   answer extraction and math-verify equivalence
sandbox.py         a killable worker process for reward calls under a deadline
"""
