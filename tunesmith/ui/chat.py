"""The Chat tab's models: each (model, adapter) loaded once and kept, and a reply streamed from
tunesmith's own chat session (generation/chat_session.py, over the one engine) as the text so far."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from ..data.images import image_part
from ..generation.chat_session import ChatSession, PathCheck
from ..hparams import GenerationArguments
from ..models.loader import inference_model_args, load_for_inference

_DONE = object()


class ModelCache:
    """(model, tokenizer) per (model path, adapter path); None for the embedded default model."""

    def __init__(self) -> None:
        self._models: dict[tuple[str | None, str | None], tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def get(self, model: str | None, adapter: str | None) -> tuple[Any, Any]:
        key = (model or None, adapter or None)
        with self._lock:
            if key not in self._models:
                self._models[key] = load_for_inference(inference_model_args(*key))
            return self._models[key]

    def __len__(self) -> int:
        return len(self._models)


def session(cache: ModelCache, model: str | None, adapter: str | None, history: list[dict],
            generation: GenerationArguments, system: str | None = None, check_path: PathCheck | None = None
            ) -> ChatSession:
    """A chat session on the cached model whose history is the page's conversation so far. check_path: where its
    commands and the history's pictures may touch files (ChatSession's); a picture outside raises its error."""
    loaded, tokenizer = cache.get(model, adapter)
    chat = ChatSession(loaded, tokenizer, generation, system=system or None, check_path=check_path)
    pictures: list[str] = []  # a picture is its own message in the page, shown with the user message after it
    for message in history:
        picture = _picture(message.get("content"))
        if message.get("role") == "user" and picture:
            pictures.append(check_path(picture, "read") if check_path else picture)
        elif message.get("role") in ("user", "assistant"):
            text = _text(message.get("content"))
            content = [*map(image_part, pictures), {"type": "text", "text": text}] if pictures else text
            chat.messages.append({"role": message["role"], "content": content})
            pictures = []
    chat.turn_systems = [chat.system] * (len(chat.messages) // 2)
    return chat


def _picture(content: Any) -> str | None:
    """The file of a picture message: Gradio's {"path": ...} as sent, or {"file": {"path": ...}} as it returns."""
    if isinstance(content, dict):
        return content.get("path") or (content.get("file") or {}).get("path")
    return None


def stream_reply(chat: ChatSession, text: str) -> Iterator[str]:
    """The reply to `text`, as the text so far after each streamed piece (the last one is the whole
    reply); generation runs in a thread so the page can show each piece as it comes."""
    pieces: queue.Queue = queue.Queue()
    outcome: list[Any] = []

    def work() -> None:
        try:
            outcome.append(chat.handle(text, on_text=pieces.put))
        except Exception as e:  # shown in the page, not lost in a thread
            outcome.append(e)
        finally:
            pieces.put(_DONE)

    threading.Thread(target=work, daemon=True).start()
    so_far = ""
    while (piece := pieces.get()) is not _DONE:
        so_far += piece
        yield so_far
    result = outcome[0] if outcome else None
    if isinstance(result, Exception):
        raise result
    if result is not None and result.kind in ("refused", "error", "info"):
        yield result.text
    elif result is not None and result.text and result.text != so_far:
        yield result.text


def _text(content: Any) -> str:
    """Gradio's message content: a string, or a list of parts holding text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content or "")
