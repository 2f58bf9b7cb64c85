"""Serve the web UI: train, follow, chat with, evaluate and export models from a browser page.

    tunesmith ui                                   # http://127.0.0.1:7860, runs under ./outputs
    tunesmith ui --root outputs --data_dir data my_data --port 7861
    tunesmith ui --host 0.0.0.0 --auth user:password   # other machines: a password is required
    tunesmith ui --allow_code                      # runs may use --trust_remote_code and package.module:function

Every button runs a `tunesmith <stage>` command, shown on the page, as its own process (an argument list,
never a shell string); the page adds no second implementation of any stage. Paths typed in the page are
confined to --root and the --data_dir folders (and the embedded default model), writes to --root; docs/ui.md says
what is confined and who can reach the page. Needs gradio, the `ui`
extra: pip install -e '.[ui]' (scripts/setup.sh installs it with the test extras).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Sequence

from ..boundary import entry_point
from ..errors import ConfigError
from ..hparams import parse_run
from ..utils.network import listen

logger = logging.getLogger(__name__)


def run(argv: Sequence[str] | None = None) -> None:
    args = parse_run("ui", argv, __doc__)
    if importlib.util.find_spec("gradio") is None:
        raise ConfigError("tunesmith ui needs gradio, which is not installed: pip install -e '.[ui]' "
                          "(or pip install 'gradio>=6,<7')")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # the page reports nothing anywhere
    from gradio.utils import get_upload_folder

    from .actions import Workbench
    from .app import build, launch

    listen(args.ui.host, args.ui.port).close()  # a busy port fails at once, in one line
    app = build(Workbench(args.ui.root, args.ui.data_dir, args.ui.allow_code, uploads=get_upload_folder()))
    logger.info("tunesmith ui at http://%s:%d (runs under %s)", args.ui.host, args.ui.port, args.ui.root)
    launch(app, args.ui.host, args.ui.port, args.ui.credentials)


main = entry_point(run)
