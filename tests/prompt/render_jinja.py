#!/usr/bin/python3
"""Renders a chat template with Debian's python3-jinja2, as the chat tests'
independent oracle. Input (JSON on stdin): {"template", "bos_token",
"eos_token", "date_string", "conversations": [[{"role", "content"}...]...]},
or "templates" (a list) in place of "template".
Output (JSON): one entry per conversation, the rendered text with the
generation prompt (a conversation ending with the assistant's message: without
it, cut after that message as Transformers' continue_final_message does), or {"error": message} when the template refuses it
(with "templates": such a list per template; a template jinja2 cannot read
gives {"error": message} in place of its list).
The environment is the one chat templates are written for: trailing block
newlines trimmed, block indentation stripped, loop controls, tojson,
raise_exception and strftime_now (fixed to the given date's day)."""
import datetime
import json
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def main():
    job = json.load(sys.stdin)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    day = datetime.datetime.strptime(job["date_string"], "%d %b %Y")
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: day.strftime(fmt)

    def continue_final(rendered, final):
        # Transformers' continue_final_message: cut after the final message.
        if final.strip() not in rendered:
            raise TemplateError("the final message is not in the rendered chat")
        at = rendered.rindex(final.strip())
        if rendered[at:at + len(final.lstrip())] == final.lstrip():
            return rendered[:at + len(final.lstrip())]
        return rendered[:at + len(final.strip())]

    def render_all(source):
        template = env.from_string(source)
        out = []
        for messages in job["conversations"]:
            prefill = messages[-1]["role"] == "assistant"
            try:
                text = template.render(messages=messages, add_generation_prompt=not prefill,
                                       bos_token=job["bos_token"], eos_token=job["eos_token"],
                                       date_string=job["date_string"])
                out.append(continue_final(text, messages[-1]["content"]) if prefill else text)
            except Exception as e:  # refused, or needs variables (tools) it lacks
                out.append({"error": f"{type(e).__name__}: {e}"})
        return out

    if "templates" in job:
        out = []
        for source in job["templates"]:
            try:
                out.append(render_all(source))
            except jinja2.TemplateError as e:
                out.append({"error": f"{type(e).__name__}: {e}"})
        json.dump(out, sys.stdout)
    else:
        json.dump(render_all(job["template"]), sys.stdout)


if __name__ == "__main__":
    main()
