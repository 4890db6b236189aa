"""Workload: what to send and when (arrivals, prompts, the plan) and the runner that sends it."""
