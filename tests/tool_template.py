"""A Qwen-style chat template with tools and <tool_call> JSON, for the test models that
call tools (mlx-lm picks its json_tools parser from it, as for real Qwen models)."""

TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
Call a tool with <tool_call>{"name": <name>, "arguments": <args>}</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' and tools %}
{%- elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{{ m.content or '' }}{% for tool_call in m.tool_calls %}{% set tool_call = tool_call.function %}<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
