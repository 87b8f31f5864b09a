"""``tempering serve``: a local model behind an OpenAI-compatible server that records episodes.

The engine is ``LocalEngine`` (a transformers model directory, or the tiny model built into the
cache with ``--tiny``); the server is ``PolicyServer``. With ``--run-dir`` the run's
``TrajectoryStore`` is the server's recorder: each episode is journaled as it happens and
appended when it ends, so ``tempering traj`` reads it like a rollout, and a server killed
outright leaves its open episodes as ``infra_error`` trajectories, recovered when a
``TrajectoryStore`` is next opened on the run (the next ``tempering serve --run-dir`` does).
``POST /v1/weights`` loads files named by the client, so beyond loopback it takes
``--allow-weight-updates``.

Ending episodes, reading them and publishing weights take the server's token (``PolicyServer``
explains why): ``$TEMPERING_SERVE_TOKEN`` or the file ``--token-file`` if it exists, else a new
one, written to ``--token-file`` (mode 0600) or printed on stderr. The URL stays the only line
on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from tempering.cli.common import positive_int
from tempering.errors import ConfigError


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)")
    return int(text)


def _cmd_serve(args: argparse.Namespace) -> int:
    from tempering.policy.config import LocalPolicyConfig, build_policy
    from tempering.serve.server import PolicyServer

    if args.model is not None and not args.model.is_dir():
        raise ConfigError(f"--model {args.model}: not a directory; give a model saved with "
                          "save_pretrained (config, weights, tokenizer), or --tiny")
    print("loading " + (str(args.model) if args.model else "the tiny model"), file=sys.stderr)
    policy = build_policy(LocalPolicyConfig(model=str(args.model) if args.model else None,
                                            device=args.device, max_batch=args.max_batch))
    store = None
    if args.run_dir is not None:
        from tempering.trajectory.store import TrajectoryStore

        store = TrajectoryStore(args.run_dir)  # recovers what a killed server left

    token, told = _token(args.token_file)

    async def serve() -> None:
        server = PolicyServer(policy, host=args.host, port=args.port,
                              model_name=args.served_model_name, recorder=store,
                              allow_weight_updates=args.allow_weight_updates, token=token)
        try:
            await server.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {args.host}:{args.port} ({exc.strerror}); "
                              "choose another --port (0 picks a free one)") from None
        try:
            print(server.url, flush=True)
            print(told, file=sys.stderr)
            print(f"serving {policy.name} as {server.model_name!r}"
                  + (f", episodes into {args.run_dir}" if store else "")
                  + "; Ctrl-C to stop", file=sys.stderr)
            await asyncio.Event().wait()
        finally:
            await server.close()  # open episodes are stored as infra errors, not dropped
            await policy.aclose()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        if store is not None:
            store.close()
    return 0


TOKEN_ENV = "TEMPERING_SERVE_TOKEN"


def _token(path: Path | None) -> tuple[str, str]:
    """The server's token and what to tell the operator about it (never the token itself
    when it came from them)."""
    given = os.environ.get(TOKEN_ENV)
    if given:
        return given.strip(), f"token: from ${TOKEN_ENV}"
    if path is not None and path.exists():
        token = path.read_text().strip()
        if not token:
            raise ConfigError(f"--token-file {path} is empty; remove it to have a token "
                              "generated into it, or write one there")
        return token, f"token: from {path}"
    token = secrets.token_urlsafe(32)
    if path is None:
        return token, (f"token (ending episodes, reading them, POST /v1/weights): {token}; "
                       f"send it as `Authorization: Bearer <token>`, or start with "
                       f"${TOKEN_ENV} or --token-file to choose where it comes from")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot create --token-file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, f"token: written to {path} (mode 0600)"


_SERVE_EPILOG = """\
examples:
  tempering serve --tiny --port 8000 --token-file token
  tempering serve --model ~/models/qwen2.5-0.5b-instruct --run-dir runs/serve-1
  curl -s http://127.0.0.1:8000/v1/chat/completions -H 'X-Tempering-Episode: ep1' \\
       -d '{"messages": [{"role": "user", "content": "hi"}]}'
  curl -s -X POST http://127.0.0.1:8000/v1/episodes/ep1/end \\
       -H "Authorization: Bearer $(cat token)" -d '{"reward": 1.0}'

Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions (not streamed; the answer
adds prompt_token_ids, choices[0].token_ids and a `tempering` object with weights_version and
prompt_reused), GET /v1/episodes/ID (the steps recorded so far) and POST /v1/episodes/ID/end
(optional reward, task_id, status). A request's episode is its X-Tempering-Episode header, else
tempering.episode_id, else user. GET/POST /v1/weights read and load weights versions
(--allow-weight-updates beyond loopback). GET/POST /v1/episodes/ID and POST /v1/weights take
the server's token (Authorization: Bearer TOKEN): $TEMPERING_SERVE_TOKEN, --token-file, or a
new one printed on stderr. Prints the base URL on stdout; see docs/policy.md.
"""


def add_policy_commands(commands: Any) -> None:
    serve = commands.add_parser(
        "serve", help="serve a local model over an OpenAI-compatible API, recording episodes",
        description="Serve a local model (transformers format) over an OpenAI-compatible HTTP "
                    "API, as vLLM would, and record every completion token for token as a "
                    "trajectory step of the episode it belongs to, so any OpenAI client's "
                    "episodes become training data.", epilog=_SERVE_EPILOG)
    model = serve.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", type=Path, metavar="DIR",
                       help="a model directory written by save_pretrained (loaded offline)")
    model.add_argument("--tiny", action="store_true",
                       help="the tiny test model, built into ~/.cache/tempering on first use")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: 127.0.0.1; 0.0.0.0 for every "
                            "interface: completions need no token, and there is no TLS)")
    serve.add_argument("--port", type=_port, default=8000, metavar="PORT",
                       help="port to listen on; 0 picks a free one (default: 8000)")
    serve.add_argument("--run-dir", type=Path, metavar="DIR",
                       help="journal each episode into this run's trajectory store as it "
                            "happens and store it when it ends (default: episodes are not "
                            "kept after they end)")
    serve.add_argument("--allow-weight-updates", action="store_true", default=None,
                       help="accept POST /v1/weights (load a checkpoint from a path on this "
                            "machine as a new weights version) even when --host is beyond "
                            "loopback; only on a trusted network (default: accepted on "
                            "loopback only)")
    serve.add_argument("--token-file", type=Path, metavar="FILE",
                       help="the token that ending episodes, reading them and publishing "
                            "weights take: read from FILE if it exists, else generated into "
                            f"it (mode 0600); ${TOKEN_ENV} takes precedence (default: "
                            "generated and printed on stderr)")
    serve.add_argument("--served-model-name", metavar="NAME",
                       help="the model name /v1/models reports (default: local:<directory>)")
    serve.add_argument("--device", default="cpu",
                       help="torch device for the model, e.g. cuda (default: cpu)")
    serve.add_argument("--max-batch", type=positive_int, default=16, metavar="N",
                       help="most requests sampled together in one batch (default: 16)")
    serve.set_defaults(func=_cmd_serve)
