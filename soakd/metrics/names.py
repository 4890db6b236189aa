"""Metric names: every name soakd exports, and the names it reads from others, as constants.

The exported names (what Prometheus stores, so a counter's ``_total`` and an info's
``_info`` are part of them; a histogram's family name, without ``_bucket``) are defined by
the metric classes of ``soakd/metrics/run.py`` through these constants, and read through them
by the probes (the samples they journal), the gateway re-export and the simulator. The
foreign names (vLLM's, llama.cpp's, DCGM's, a process collector's) are what the probes read
and what the simulator serves in their place. ``tests/unit/test_metric_names.py`` checks
that every name the probes, the report, the alert rules and the dashboards read is one of
soakd's registered names or listed here as foreign.
"""

# ruff: noqa: S105  # names with TOKEN in them are metric names, not secrets

from __future__ import annotations

from typing import Final

# --- requests and the run (Metrics) ---------------------------------------------------
BUILD_INFO: Final = "soakd_build_info"
REQUESTS_TOTAL: Final = "soakd_requests_total"
OUTPUT_TOKENS_TOTAL: Final = "soakd_output_tokens_total"
PROMPT_TOKENS_TOTAL: Final = "soakd_prompt_tokens_total"
SENDS_MISSED_TOTAL: Final = "soakd_sends_missed_total"
CONVERSATIONS_TOTAL: Final = "soakd_conversations_total"
OOM_ERRORS_TOTAL: Final = "soakd_oom_errors_total"
USAGE_REJECTED_TOTAL: Final = "soakd_usage_rejected_total"
USAGE_MISMATCH_TOTAL: Final = "soakd_usage_mismatch_total"
RETRY_AFTER_UNREADABLE_TOTAL: Final = "soakd_retry_after_unreadable_total"
REQUEST_DURATION_SECONDS: Final = "soakd_request_duration_seconds"
TIME_TO_FIRST_TOKEN_SECONDS: Final = "soakd_time_to_first_token_seconds"
INTER_TOKEN_LATENCY_SECONDS: Final = "soakd_inter_token_latency_seconds"
TIME_PER_OUTPUT_TOKEN_SECONDS: Final = "soakd_time_per_output_token_seconds"
DISPATCH_LAG_SECONDS: Final = "soakd_dispatch_lag_seconds"
TTFT_BY_CONTEXT_SECONDS: Final = "soakd_ttft_by_context_seconds"
TURN_TTFT_SECONDS: Final = "soakd_turn_ttft_seconds"
IN_FLIGHT_REQUESTS: Final = "soakd_in_flight_requests"
OFFERED_RATE_RPS: Final = "soakd_offered_rate_rps"
OFFERED_CONCURRENCY: Final = "soakd_offered_concurrency"
PHASE_ACTIVE: Final = "soakd_phase_active"
PHASE_INDEX: Final = "soakd_phase_index"
RUN_ELAPSED_SECONDS: Final = "soakd_run_elapsed_seconds"
RUN_REMAINING_SECONDS: Final = "soakd_run_remaining_seconds"
EVENT_LOOP_DELAY_SECONDS: Final = "soakd_event_loop_delay_seconds"
EVENT_LOOP_TASKS: Final = "soakd_event_loop_tasks"
SINK_FAILURES_TOTAL: Final = "soakd_sink_failures_total"
# --- sender worker processes (soakd/workers, run.workers > 1) -----------------------------
WORKERS: Final = "soakd_workers"
WORKERS_UP: Final = "soakd_workers_up"
WORKER_REQUESTS_TOTAL: Final = "soakd_worker_requests_total"
WORKER_RESTARTS_TOTAL: Final = "soakd_worker_restarts_total"
WORKER_CLOCK_OFFSET_SECONDS: Final = "soakd_worker_clock_offset_seconds"
RUN_START_TIME_SECONDS: Final = "soakd_run_start_time_seconds"
GOODPUT_RATIO: Final = "soakd_goodput_ratio"
GOODPUT_RPS: Final = "soakd_goodput_rps"
RUN_5XX_RATIO: Final = "soakd_run_5xx_ratio"
RUN_ERROR_RATIO: Final = "soakd_run_error_ratio"
TARGET_NO_REUSE: Final = "soakd_target_no_reuse"
# --- GPU (ProbeMetrics, soakd/probes/gpu) ---------------------------------------------
GPU_PROBE_UP: Final = "soakd_gpu_probe_up"
GPU_INFO: Final = "soakd_gpu_info"
GPU_MEMORY_TOTAL_BYTES: Final = "soakd_gpu_memory_total_bytes"
GPU_MEMORY_USED_BYTES: Final = "soakd_gpu_memory_used_bytes"
GPU_MEMORY_FREE_BYTES: Final = "soakd_gpu_memory_free_bytes"
GPU_MEMORY_RESERVED_BYTES: Final = "soakd_gpu_memory_reserved_bytes"
GPU_MEMORY_USED_PEAK_BYTES: Final = "soakd_gpu_memory_used_peak_bytes"
GPU_PROCESS_MEMORY_BYTES: Final = "soakd_gpu_process_memory_bytes"
GPU_MEMORY_LEAK_SLOPE_BYTES_PER_HOUR: Final = "soakd_gpu_memory_leak_slope_bytes_per_hour"
GPU_MEMORY_LEAK_WINDOW_FILL_RATIO: Final = "soakd_gpu_memory_leak_window_fill_ratio"
GPU_PROCESS_MEMORY_LEAK_SLOPE_BYTES_PER_HOUR: Final = (
    "soakd_gpu_process_memory_leak_slope_bytes_per_hour"
)
GPU_TEMPERATURE_CELSIUS: Final = "soakd_gpu_temperature_celsius"
GPU_POWER_WATTS: Final = "soakd_gpu_power_watts"
GPU_ENERGY_JOULES_TOTAL: Final = "soakd_gpu_energy_joules_total"
GPU_SM_CLOCK_HERTZ: Final = "soakd_gpu_sm_clock_hertz"
GPU_MEMORY_CLOCK_HERTZ: Final = "soakd_gpu_memory_clock_hertz"
GPU_UTILIZATION_RATIO: Final = "soakd_gpu_utilization_ratio"
GPU_THROTTLE_ACTIVE: Final = "soakd_gpu_throttle_active"
GPU_XID_ERRORS_TOTAL: Final = "soakd_gpu_xid_errors_total"
# --- targets and their servers (ProbeMetrics, soakd/probes) ---------------------------
TARGET_UP: Final = "soakd_target_up"
TARGET_RESTARTS_TOTAL: Final = "soakd_target_restarts_total"
TARGET_OOM_EVENTS_TOTAL: Final = "soakd_target_oom_events_total"
TARGET_SCRAPE_ERRORS_TOTAL: Final = "soakd_target_scrape_errors_total"
SERVER_REQUESTS_RUNNING: Final = "soakd_server_requests_running"
SERVER_REQUESTS_WAITING: Final = "soakd_server_requests_waiting"
SERVER_KV_CACHE_USAGE_RATIO: Final = "soakd_server_kv_cache_usage_ratio"
SERVER_PREEMPTIONS_TOTAL: Final = "soakd_server_preemptions_total"
SERVER_PREFIX_CACHE_QUERIES_TOTAL: Final = "soakd_server_prefix_cache_queries_total"
SERVER_PREFIX_CACHE_HITS_TOTAL: Final = "soakd_server_prefix_cache_hits_total"
SERVER_RESIDENT_MEMORY_BYTES: Final = "soakd_server_resident_memory_bytes"
SERVER_START_TIME_SECONDS: Final = "soakd_server_start_time_seconds"
SERVER_RESIDENT_MEMORY_LEAK_SLOPE_BYTES_PER_HOUR: Final = (
    "soakd_server_resident_memory_leak_slope_bytes_per_hour"
)
SERVER_TIME_TO_FIRST_TOKEN_MEAN_SECONDS: Final = "soakd_server_time_to_first_token_mean_seconds"
SERVER_REQUEST_DURATION_MEAN_SECONDS: Final = "soakd_server_request_duration_mean_seconds"
SERVER_QUEUE_TIME_MEAN_SECONDS: Final = "soakd_server_queue_time_mean_seconds"
SERVER_INTER_TOKEN_LATENCY_MEAN_SECONDS: Final = "soakd_server_inter_token_latency_mean_seconds"
E2E_P99_INTERVAL_SECONDS: Final = "soakd_e2e_p99_interval_seconds"
E2E_P99_DRIFT_SECONDS_PER_HOUR: Final = "soakd_e2e_p99_drift_seconds_per_hour"
# --- the journal and resumes (JournalMetrics) -----------------------------------------
JOURNAL_RECORDS_TOTAL: Final = "soakd_journal_records_total"
JOURNAL_DROPPED_RECORDS_TOTAL: Final = "soakd_journal_dropped_records_total"
JOURNAL_WRITE_ERRORS_TOTAL: Final = "soakd_journal_write_errors_total"
JOURNAL_QUEUE_DEPTH: Final = "soakd_journal_queue_depth"
JOURNAL_COMMIT_SECONDS: Final = "soakd_journal_commit_seconds"
JOURNAL_LAST_COMMIT_TIME_SECONDS: Final = "soakd_journal_last_commit_time_seconds"
JOURNAL_SIZE_BYTES: Final = "soakd_journal_size_bytes"
JOURNAL_MAX_BYTES: Final = "soakd_journal_max_bytes"
JOURNAL_DISK_FREE_BYTES: Final = "soakd_journal_disk_free_bytes"
JOURNAL_ROWS_KEPT: Final = "soakd_journal_rows_kept"
JOURNAL_ROWS_DROPPED_TOTAL: Final = "soakd_journal_rows_dropped_total"
JOURNAL_WRITER_RESTARTS_TOTAL: Final = "soakd_journal_writer_restarts_total"
RUN_DOWNTIME_SECONDS_TOTAL: Final = "soakd_run_downtime_seconds_total"
RUN_RESUMES_TOTAL: Final = "soakd_run_resumes_total"
# --- checks (CheckMetrics: soakd/metrics/checks.py) -------------------------------------
CHECKS_TOTAL: Final = "soakd_checks_total"
TARGET_IDENTITY_INFO: Final = "soakd_target_identity_info"
TARGET_IDENTITY_CHANGES_TOTAL: Final = "soakd_target_identity_changes_total"

# --- soakd capacity (CapacityMetrics) ----------------------------------------------------
CAPACITY_STEP: Final = "soakd_capacity_step"
CAPACITY_RATE: Final = "soakd_capacity_rate"
CAPACITY_VERDICT: Final = "soakd_capacity_verdict"
CAPACITY_KNEE: Final = "soakd_capacity_knee"
# --- send guards (GuardMetrics) -------------------------------------------------------
TARGET_PAUSED: Final = "soakd_target_paused"
TARGET_PAUSES_TOTAL: Final = "soakd_target_pauses_total"
TARGET_FAILING: Final = "soakd_target_failing"
SPEND_CAP_HITS_TOTAL: Final = "soakd_spend_cap_hits_total"
SPEND_USED: Final = "soakd_spend_used"
SPEND_LIMIT: Final = "soakd_spend_limit"
# --- limits: the run-wide SLO and alert limits, exported only when set (Metrics.set_limits) --
LIMIT_VRAM: Final = "soakd_vram_limit_bytes"
LIMIT_ERROR_RATIO: Final = "soakd_error_ratio_limit"
LIMIT_SERVER_ERROR_RATIO: Final = "soakd_server_error_ratio_limit"
LIMIT_E2E: Final = "soakd_slo_e2e_p99_seconds"
LIMIT_TTFT: Final = "soakd_slo_ttft_p99_seconds"
LIMIT_TPOT: Final = "soakd_slo_tpot_p99_seconds"
LIMIT_JITTER: Final = "soakd_jitter_ratio_limit"
LIMIT_LEAK: Final = "soakd_vram_leak_limit_bytes_per_hour"
LIMIT_LAG: Final = "soakd_dispatch_lag_limit_seconds"
LIMIT_DRIFT: Final = "soakd_e2e_p99_drift_limit_seconds_per_hour"

# --- soakd gateway (GatewayMetrics; re-exported by soakd run with a target label) -----
GATEWAY_BUILD_INFO: Final = "soakd_gateway_build_info"
GATEWAY_UPSTREAM_RESPONSES_TOTAL: Final = "soakd_gateway_upstream_responses_total"
GATEWAY_UPSTREAM_ERRORS_TOTAL: Final = "soakd_gateway_upstream_errors_total"
GATEWAY_REJECTIONS_TOTAL: Final = "soakd_gateway_rejections_total"
GATEWAY_IN_FLIGHT_REQUESTS: Final = "soakd_gateway_in_flight_requests"
GATEWAY_QUEUE_DEPTH: Final = "soakd_gateway_queue_depth"
GATEWAY_CONCURRENCY_LIMIT: Final = "soakd_gateway_concurrency_limit"
GATEWAY_CONCURRENCY_LIMIT_CHANGES_TOTAL: Final = "soakd_gateway_concurrency_limit_changes_total"
GATEWAY_UPSTREAM_TTFB_P95_SECONDS: Final = "soakd_gateway_upstream_ttfb_p95_seconds"
GATEWAY_LATENCY_TARGET_SECONDS: Final = "soakd_gateway_latency_target_seconds"
GATEWAY_BREAKER_STATE: Final = "soakd_gateway_breaker_state"
GATEWAY_BREAKER_TRANSITIONS_TOTAL: Final = "soakd_gateway_breaker_transitions_total"
GATEWAY_FEATURE_ENABLED: Final = "soakd_gateway_feature_enabled"
GATEWAY_VRAM_USED_BYTES: Final = "soakd_gateway_vram_used_bytes"
GATEWAY_VRAM_LIMIT_BYTES: Final = "soakd_gateway_vram_limit_bytes"
GATEWAY_VRAM_LOWER_MARK_BYTES: Final = "soakd_gateway_vram_lower_mark_bytes"
GATEWAY_VRAM_PROBE_UP: Final = "soakd_gateway_vram_probe_up"
GATEWAY_UPSTREAM_TTFB_SECONDS: Final = "soakd_gateway_upstream_ttfb_seconds"
GATEWAY_UPSTREAM_DURATION_SECONDS: Final = "soakd_gateway_upstream_duration_seconds"
GATEWAY_QUEUE_WAIT_SECONDS: Final = "soakd_gateway_queue_wait_seconds"
GATEWAY_UP: Final = "soakd_gateway_up"
"""Served by ``soakd run`` itself (soakd/probes/gateways.py): 1 while a gateway it started
answers its scrape."""

# --- foreign: names soakd reads (and the simulator serves) ----------------------------------
# vLLM (reference: tests/data/vllm-0.32-cpu-metrics.txt). Families: a histogram's samples
# add _bucket, _sum and _count; a counter's add _total.
VLLM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
VLLM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
VLLM_GPU_CACHE_USAGE: Final = "vllm:gpu_cache_usage_perc"
"""vLLM before 0.10 (V0 engine): the same reading under its older name."""
VLLM_PREEMPTIONS: Final = "vllm:num_preemptions"
VLLM_TTFT_SECONDS: Final = "vllm:time_to_first_token_seconds"
VLLM_E2E_SECONDS: Final = "vllm:e2e_request_latency_seconds"
VLLM_QUEUE_SECONDS: Final = "vllm:request_queue_time_seconds"
VLLM_ITL_SECONDS: Final = "vllm:inter_token_latency_seconds"
VLLM_GENERATION_TOKENS: Final = "vllm:generation_tokens"
VLLM_PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries"
"""Prompt tokens looked up in the prefix cache (a counter: vllm:prefix_cache_queries_total)."""
VLLM_PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits"
"""Of them, the tokens found there (llama.cpp serves no such counter)."""

# llama.cpp's llama-server (reference: tests/data/llama-server-metrics.txt)
LLAMACPP_REQUESTS_PROCESSING: Final = "llamacpp:requests_processing"
LLAMACPP_REQUESTS_DEFERRED: Final = "llamacpp:requests_deferred"
LLAMACPP_KV_CACHE_USAGE: Final = "llamacpp:kv_cache_usage_ratio"
"""Older llama-server builds only: the captured one serves no KV-cache reading at all."""
LLAMACPP_TOKENS_PREDICTED_SECONDS: Final = "llamacpp:tokens_predicted_seconds"
LLAMACPP_TOKENS_PREDICTED: Final = "llamacpp:tokens_predicted"

# prometheus_client's process collector (vLLM, llama-server with --metrics: no)
PROCESS_RESIDENT_MEMORY_BYTES: Final = "process_resident_memory_bytes"
PROCESS_START_TIME_SECONDS: Final = "process_start_time_seconds"

# NVIDIA dcgm-exporter (the simulator serves the same names for its simulated card)
DCGM_FB_USED: Final = "DCGM_FI_DEV_FB_USED"
DCGM_FB_FREE: Final = "DCGM_FI_DEV_FB_FREE"
DCGM_FB_RESERVED: Final = "DCGM_FI_DEV_FB_RESERVED"
DCGM_FB_TOTAL: Final = "DCGM_FI_DEV_FB_TOTAL"
DCGM_GPU_TEMP: Final = "DCGM_FI_DEV_GPU_TEMP"
DCGM_POWER_USAGE: Final = "DCGM_FI_DEV_POWER_USAGE"
DCGM_TOTAL_ENERGY: Final = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
DCGM_SM_CLOCK: Final = "DCGM_FI_DEV_SM_CLOCK"
DCGM_MEM_CLOCK: Final = "DCGM_FI_DEV_MEM_CLOCK"
DCGM_GPU_UTIL: Final = "DCGM_FI_DEV_GPU_UTIL"
DCGM_XID_ERRORS: Final = "DCGM_FI_DEV_XID_ERRORS"
DCGM_CLOCKS_EVENT_REASONS: Final = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
DCGM_CLOCK_THROTTLE_REASONS: Final = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
"""dcgm-exporter before 3.3: the same bitmask under its older name."""

VLLM: Final = frozenset(
    {
        VLLM_REQUESTS_RUNNING,
        VLLM_REQUESTS_WAITING,
        VLLM_KV_CACHE_USAGE,
        VLLM_PREEMPTIONS,
        VLLM_TTFT_SECONDS,
        VLLM_E2E_SECONDS,
        VLLM_QUEUE_SECONDS,
        VLLM_ITL_SECONDS,
        VLLM_GENERATION_TOKENS,
        VLLM_PREFIX_CACHE_QUERIES,
        VLLM_PREFIX_CACHE_HITS,
    }
)
"""The vLLM families soakd reads that today's vLLM serves (not the older aliases)."""
VLLM_SIM_ONLY: Final = frozenset(
    {
        "vllm:prompt_tokens",
        "vllm:request_success",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:iteration_tokens_total",
        "vllm:request_params_max_tokens",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:cache_config_info",
    }
)
"""vLLM families the simulator serves as vLLM does, that soakd itself never reads."""
LLAMACPP: Final = frozenset(
    {
        LLAMACPP_REQUESTS_PROCESSING,
        LLAMACPP_REQUESTS_DEFERRED,
        LLAMACPP_TOKENS_PREDICTED_SECONDS,
        LLAMACPP_TOKENS_PREDICTED,
    }
)
DCGM: Final = frozenset(
    {
        DCGM_FB_USED,
        DCGM_FB_FREE,
        DCGM_FB_RESERVED,
        DCGM_FB_TOTAL,
        DCGM_GPU_TEMP,
        DCGM_POWER_USAGE,
        DCGM_TOTAL_ENERGY,
        DCGM_SM_CLOCK,
        DCGM_MEM_CLOCK,
        DCGM_GPU_UTIL,
        DCGM_XID_ERRORS,
        DCGM_CLOCKS_EVENT_REASONS,
        DCGM_CLOCK_THROTTLE_REASONS,
    }
)
FOREIGN: Final = (
    VLLM
    | LLAMACPP
    | DCGM
    | VLLM_SIM_ONLY
    | {
        VLLM_GPU_CACHE_USAGE,
        LLAMACPP_KV_CACHE_USAGE,
        PROCESS_RESIDENT_MEMORY_BYTES,
        PROCESS_START_TIME_SECONDS,
    }
)
"""Every foreign family name in soakd's code (read by the probes, or served by the
simulator), listed explicitly."""
