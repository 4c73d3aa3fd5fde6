from __future__ import annotations

import math

from metrale_server.tui.metrics_reading import MetricsReading

EXPOSITION = """\
# TYPE metrale_num_requests_running gauge
metrale_num_requests_running{model_name="m"} 3.0
# TYPE metrale_num_requests_waiting gauge
metrale_num_requests_waiting{model_name="m"} 1.0
# TYPE metrale_kv_cache_usage_perc gauge
metrale_kv_cache_usage_perc{model_name="m"} 0.5
# TYPE metrale_prompt_tokens counter
metrale_prompt_tokens_total{model_name="m"} 120.0
# TYPE metrale_generation_tokens counter
metrale_generation_tokens_total{model_name="m"} 64.0
# TYPE metrale_prefix_cache_queries counter
metrale_prefix_cache_queries_total{model_name="m"} 100.0
# TYPE metrale_prefix_cache_hits counter
metrale_prefix_cache_hits_total{model_name="m"} 25.0
# TYPE metrale_num_preemptions counter
metrale_num_preemptions_total{model_name="m"} 2.0
# TYPE metrale_spec_decode_num_draft_tokens counter
metrale_spec_decode_num_draft_tokens_total{model_name="m"} 40.0
# TYPE metrale_spec_decode_num_accepted_tokens counter
metrale_spec_decode_num_accepted_tokens_total{model_name="m"} 10.0
# TYPE metrale_time_to_first_token_seconds histogram
metrale_time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 1.0
metrale_time_to_first_token_seconds_bucket{le="1.0",model_name="m"} 3.0
metrale_time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 3.0
metrale_time_to_first_token_seconds_count{model_name="m"} 3.0
metrale_time_to_first_token_seconds_sum{model_name="m"} 1.2
# TYPE metrale_request_success counter
metrale_request_success_total{finished_reason="stop",model_name="m"} 2.0
metrale_request_success_total{finished_reason="length",model_name="m"} 1.0
"""


def test_parses_gauges_counters_and_histograms() -> None:
    reading = MetricsReading.from_prometheus_text(EXPOSITION)
    assert reading.num_running == 3
    assert reading.num_waiting == 1
    assert reading.kv_usage == 0.5
    assert reading.num_prompt_tokens == 120
    assert reading.num_generation_tokens == 64
    assert reading.prefix_hit_rate == 0.25
    assert reading.num_preemptions == 2
    assert reading.draft_acceptance_rate == 0.25
    assert reading.num_finished_by_reason == {"stop": 2, "length": 1}
    assert reading.num_finished == 3
    assert reading.ttft.upper_bounds == (0.1, 1.0, math.inf)
    assert reading.ttft.cumulative_counts == (1.0, 3.0, 3.0)
    assert reading.tpot.count == 0


def test_missing_metrics_read_as_zero() -> None:
    reading = MetricsReading.from_prometheus_text("")
    assert reading.num_running == 0
    assert reading.prefix_hit_rate is None
    assert reading.ttft.quantile(0.5) is None
