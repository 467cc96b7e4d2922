"""The rewards of a run: the sources (`sources.py`), the one scorer every reward call goes through
(`scoring.py`), reward models, the extra context a reward function receives, the time limit."""
