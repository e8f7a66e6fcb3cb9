"""Analysis of the results store, in the order ``sweeps/analyze.py`` runs it: ``load`` (ok trials, filters,
reported-split questions) -> ``select`` (Table 1's lr per beta, the best beta) -> ``questions`` (question-level
ECE intervals, paired differences to beta = 0) -> ``tables`` (CSV, Markdown) and ``figures`` (PNG)."""
