"""The web UI (`tunesmith ui`): a Gradio page whose buttons run the same `tunesmith <stage>` commands as the
CLI, each as its own process. args.py and rules.py are its own settings and their refusals, command.py
starts it, command_lines.py builds the argument lists of the runs, jobs.py runs and stops them, runs.py
reads output folders, chat.py keeps the chat models, actions.py is what the buttons do, app.py the page."""
