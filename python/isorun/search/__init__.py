"""Searchers for sweeps that choose each trial from the results so far (docs/sweeps.md#search).

``python -m isorun.search.optuna`` is the searcher a spec's ``search: {type: optuna, ...}`` runs:
Optuna's samplers behind isorun's searcher protocol (JSON lines on stdin and stdout). A searcher
of one's own, in any language, speaks the same protocol (``search: {type: command, ...}``)."""
