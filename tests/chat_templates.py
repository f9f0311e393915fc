"""Chat templates of real model families, written out for offline tests (no hub download).

`QWEN_THINK_TEMPLATE` follows Qwen3's template (tools in the system turn, assistant tool calls,
tool results grouped into one user turn of <tool_response> blocks), with the `<think>` handling
of QwQ and DeepSeek-R1: every assistant turn but the last loses its `<think>...</think>` block
when rendered. That is the template on which re-rendering a history changes tokens that were
sampled, which the multi-turn tests must catch.
"""

QWEN_THINK_TEMPLATE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and " }}
    {{- "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": " }}
    {{- "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {%- if '</think>' in content and not loop.last %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' + content }}
        {%- for call in message.tool_calls or [] %}
            {{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
            {{- (call.function.arguments | tojson) + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""


def qwen_think_tokenizer():
    """The tiny byte-level tokenizer (ChatML specials) with `QWEN_THINK_TEMPLATE`."""
    from sparrow.models.loading import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = QWEN_THINK_TEMPLATE
    return tokenizer
