# Executed by train_globals.py: every `--name=value` argument replaces the global `name` (a value parsed as a
# Python literal when it is one, else kept as text).
import ast
import sys

for _argument in sys.argv[1:]:
    _name, _, _text = _argument.removeprefix("--").partition("=")
    try:
        _value = ast.literal_eval(_text)
    except (SyntaxError, ValueError):
        _value = _text
    globals()[_name] = _value
