"""Chat with a model, over several rounds, in a terminal or from a pipe.

    python chat/cli.py                                   # the embedded SmolLM2-135M-Instruct
    python chat/cli.py --model_name_or_path outputs/sft  # an adapter dir (base from adapter_config.json)
    python chat/cli.py --model_name_or_path M --adapter A --do_sample false --max_new_tokens 128
    printf 'Hi!\\nWhat did I just say?\\n' | python chat/cli.py --do_sample false > answers.txt

Commands (typed as a message):
    clear          forget the history (the system prompt stays)
    /system TEXT   set the system prompt (`/system` alone: back to the template's default)
    /save FILE     append the conversation to FILE as one {"messages": [...]} line (SFT training data)
    quit, exit, stop (or Ctrl-D / Ctrl-C) end the chat

From a pipe: one prompt per input line, one answer per output line on stdout; everything else goes
to stderr. The recipe is tunesmith/chat/cli.py (also installed as `tunesmith-chat`).
"""

from tunesmith.chat.cli import main

if __name__ == "__main__":
    main()
