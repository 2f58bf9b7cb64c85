"""`tunesmith vllm-serve`: vLLM's OpenAI server started with what tunesmith's rollouts (--rollout_engine vllm) and
its serving checks need (generation/vllm_server.py)."""
