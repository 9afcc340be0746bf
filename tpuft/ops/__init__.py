"""The verbs as plain library functions: typed arguments in, a dataclass out, no printing.

Progress leaves through callbacks (``on_line`` for worker output, ``progress`` for waits) that the CLI turns
into rich output; a Python caller can pass its own or none.
"""
