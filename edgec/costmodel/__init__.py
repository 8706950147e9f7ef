"""The learned cost model: each region's static/dynamic option, and how the artifact executes.

- :mod:`.features`: numbers that describe a region under an option at a shape on a target.
- :mod:`.store`: the append-only measurement store ``measurements.jsonl`` of each target.
- :mod:`.measure`: timing each region's options on samples (``costmodel collect``, ``oracle``).
- :mod:`.learn`: the learners (ridge, boosted trees), fitted and saved as JSON.
- :mod:`.decide`: choosing per region the option of least expected latency under budgets.
- :mod:`.execution`: the whole artifact's library route and thread count, priced per option.
- :mod:`.evaluate`: leave-one-model-out evaluation against measured oracles.
"""
