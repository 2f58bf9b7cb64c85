"""An OpenAI-compatible HTTP server for a trained model: the protocol (protocol.py), incremental
decoding and sampling (decoding.py), batched generation (generation.py) on one worker thread fed by
a scheduler (scheduler.py), and the FastAPI routes (app.py). Its command line is recipes/serve.py."""
