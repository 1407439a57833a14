"""`ninfer generate ART|--demo (--prompt TEXT | --messages FILE.json | --prompt-ids 1,2,3)`.

Runs one request through the public Engine and prints the text as it streams, or one JSON object
(`--json`): text, content, reasoning_content, tool_calls, token_ids, logprobs (of each generated
token under the model's distribution before sampling filters), finish_reason, usage, timings.
"""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text from a prompt",
                              description=__doc__.split("\n\n")[1])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("artifact", metavar="ART", nargs="?", help=".ninfer file")
    src.add_argument("--demo", action="store_true", help="use the embedded demo model")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="raw prompt text (no chat template)")
    prompt.add_argument("--messages", metavar="FILE.json",
                        help="chat messages (a JSON list, or an object with 'messages' and "
                             "optional 'tools'), rendered with the chat template")
    prompt.add_argument("--prompt-ids", metavar="IDS", help="comma-separated token ids")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS tokens")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--max-context-len", type=int, help="cap on prompt + output tokens")
    p.add_argument("--no-verify", action="store_true", help="skip the artifact digest check")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.set_defaults(func=run)


def _prompt_ids(raw: str) -> list[int]:
    from ninfer.errors import InvalidInput

    try:
        ids = [int(tok) for tok in raw.replace(" ", "").split(",") if tok]
    except ValueError:
        raise InvalidInput(f"--prompt-ids must be comma-separated integers, got {raw!r}") from None
    if not ids:
        raise InvalidInput("--prompt-ids is empty")
    return ids


def _messages(path: str) -> tuple[list, list | None]:
    import json

    from ninfer.errors import InvalidInput

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, dict):
        return data.get("messages"), data.get("tools")
    return data, None


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from ninfer.errors import InvalidInput
    from ninfer.models.qwen3_5.startup import ProgramOptions
    from ninfer.models.registry import eos_token_ids, load_model_instance
    from ninfer.runtime.contract import SamplingParams
    from ninfer.runtime.contract.output import TokenOutputSession
    from ninfer.runtime.engine import Engine
    from ninfer.runtime.request import GenerationRequest

    if args.max_tokens < 1:
        raise InvalidInput("--max-tokens must be >= 1")
    if args.device not in ("cpu", "cuda"):
        raise InvalidInput(f"unknown device {args.device!r} (expected cpu or cuda)")
    path = args.artifact
    if args.demo:
        from tools.demo import demo_artifact_path

        path = demo_artifact_path(progress=not args.json)
    opts = ProgramOptions(device=args.device, max_concurrency=1,
                          max_context_len=args.max_context_len)
    inst = load_model_instance(path, opts, verify=not args.no_verify)
    frontend = inst.frontend
    if frontend is None and args.prompt_ids is None:
        raise InvalidInput("this artifact has no tokenizer: use --prompt-ids")
    if args.prompt_ids is not None:
        ids = _prompt_ids(args.prompt_ids)
        prepared = frontend.prepare_completion(ids) if frontend else None
    elif args.messages is not None:
        messages, tools = _messages(args.messages)
        prepared = frontend.prepare_chat(messages, tools=tools)
    else:
        prepared = frontend.prepare_completion(args.prompt)
    if prepared is not None:
        ids = list(prepared.token_ids)
        session = frontend.new_session(prepared, ignore_eos=args.ignore_eos)
        defaults = dict(frontend.sampling_defaults)
    else:
        stops = () if args.ignore_eos else eos_token_ids(inst.generation_defaults)
        session = TokenOutputSession(stops)
        defaults = {}
    overrides = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                 "min_p": args.min_p, "seed": args.seed}
    defaults.update({k: v for k, v in overrides.items() if v is not None})
    request = GenerationRequest(prompt_token_ids=tuple(ids), sampling=SamplingParams(**defaults),
                                max_tokens=args.max_tokens, session=session)
    engine = Engine(inst.program, max_concurrency=1, max_queue=0)
    try:
        with engine.submit(request) as handle:
            for event in handle:
                delta = getattr(event, "delta", None)
                if not args.json and delta is not None and hasattr(delta, "content"):
                    sys.stdout.write(delta.reasoning + delta.content)
                    sys.stdout.flush()
            result = handle.wait()
    finally:
        engine.shutdown()
        inst.close()
    if args.json:
        out = {
            "text": frontend.tokenizer.decode(result.token_ids, skip_special_tokens=True)
            if frontend else None,
            "token_ids": list(result.token_ids),
            "logprobs": list(result.logprobs),
            "finish_reason": result.finish_reason,
            "usage": {"prompt_tokens": result.prompt_tokens,
                      "completion_tokens": result.completion_tokens},
            "timings": {"queued_s": result.timings.queued_s, "ttft_s": result.timings.ttft_s,
                        "total_s": result.timings.total_s},
        }
        if prepared is not None:
            message = session.message()
            out["content"] = message.content
            out["reasoning_content"] = message.reasoning_content
            out["tool_calls"] = [c.to_openai() for c in message.tool_calls]
            out["finish_reason"] = message.finish_reason or result.finish_reason
        print(json.dumps(out, ensure_ascii=False))
    else:
        print()
    return 0
