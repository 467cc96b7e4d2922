"""The user's code: rewards, tools and metrics named in a recipe or an argument.

- `callables.py`: `load_callable`, one spelling everywhere ("module:function", "file.py:function");
- `worker.py`: the forked worker process they run in, which a time limit can always stop.
"""
