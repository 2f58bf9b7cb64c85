"""An OpenAI-compatible HTTP server for a trained model: the protocol (protocol.py), which tools a
reply may call (tool_choice.py; calls are parsed by data/tool_calls.py), a reply split into reasoning, content and calls (reply.py), log-probabilities in OpenAI's
shape (logprobs.py), and the FastAPI routes (app.py); generation runs on the engine's worker thread
(generation/worker.py). Its settings are args.py's, their refusals rules.py's, and its command line
command.py."""
