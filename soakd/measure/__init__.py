"""Measure room: pure arithmetic over outcomes (folds, quantiles, goodput, verdicts, cost).

No files, no sockets: what is here runs the same in soakd, its workers and the journal's writer."""
