"""`tunesmith chat`: multi-round chat with a trained model in a terminal or from a pipe. Its settings are args.py's,
their refusals rules.py's, and the read-print loop command.py's; the conversation itself (the history, its token
budget, the commands) is the core's ChatSession (generation/chat_session.py), which the web UI's Chat tab holds too."""
