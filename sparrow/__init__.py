"""sparrow: GRPO with sparse rollouts held above a tail-acceptance threshold."""
