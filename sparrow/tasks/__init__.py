"""Prompts and rewards; imports no other part of sparrow.

generators.py      the embedded, seeded task generator (arithmetic, long-context lookup, chain)
chain.py           the long-generation task: an addition chain worked out line by line
data.py            DataConfig, prompt datasets (embedded, JSONL, HF), the batch iterator
data_sources.py    where rows come from: the task generator, a local file, a hub dataset
prompt_rows.py     a row's prompt: a column, a {column} template or a message list
answer_extractors.py  a row's reference answer: as is, GSM8K's "#### N", MATH's \\boxed{}
data_errors.py     DataError, the one-line error of unusable data
rewards.py         the reward config, the registry of rewards by name, build_reward
reward_guard.py    the guard (failures and overruns counted, scored 0) and batch scoring
user_reward.py     a user's reward function named by rl.reward.function (file or module)
reward_result.py   what a reward returns, and its timeout
math_verifier.py   answer extraction and math-verify equivalence
sandbox.py         a killable worker process for reward calls under a deadline
environment.py     multi-turn environments: the protocol, env.function loading, each turn's tokens
tool_calls.py      Hermes/Qwen <tool_call> parsing, tool results as messages, the tools prompt
env_guard.py       the environment guard (timeouts, faults, oversize, non-text; isolate) and counts
env_worker.py      the guard's side in the isolated worker (imports no torch)
envs/              built-in environments: calculator, python (envs/__init__.py maps them)
"""
