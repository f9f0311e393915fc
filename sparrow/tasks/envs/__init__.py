"""Built-in environments for `env.function` (a name in environment.BUILTIN_ENVS).

tool_task.py     ToolTask: a question, tools, and a reward on the final answer (the building block)
calculator.py    `calculator`: an exact arithmetic tool, for tests and the tiny CPU run
python_tool.py   `python`: code run in a sandbox worker (time, memory, no network, temp-dir files)
"""
