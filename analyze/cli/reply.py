"""`kvtrace reply`: what the triage bot does on a GitHub thread (analyze/views/reply.py), for a workflow to carry
out: the action in JSON on stdout, the comment in a file."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kvtrace.analyze.cli.options import fail, link_policy, links_options, parse_or_fail, progress_option


@click.command("reply")
@click.argument("thread", metavar="THREAD")
@click.option("--bot", "bot", required=True, metavar="LOGIN",
              help="The login the bot posts as (a workflow's token: github-actions[bot]); only its comments that "
                   "open with kvtrace's marker are kvtrace's.")
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Write the comment to post or edit here (emptied when there is nothing to do).")
@links_options
@progress_option
def reply_command(thread: str, bot: str, out: Path, fetch_links: bool, github_url: str, api_url: str,
                  progress: bool | None) -> None:
    """What the triage bot does on one GitHub thread: post its comment, edit it, or nothing.

    THREAD is the whole thread as JSON: `gh issue view N --json title,body,comments,url`, or the REST API's issue
    and its comments (`jq -s . issue.json comments.json`). A verdict is posted only when a log proves it (proof
    "log" or "runtime"); otherwise only what the report is missing, once. kvtrace's comment is edited only when a
    log changes the verdict. Prints one JSON object: action (post, edit, none), comment_id, reason, kind,
    signature, side, proof.

    Exit 0 when the thread was read, 2 when it could not be read or is no GitHub thread.

    \b
    Examples:
      gh issue view 28 --json title,body,comments,url > thread.json
      kvtrace reply thread.json --bot github-actions[bot] -o comment.md | jq -r .action
      kvtrace reply thread.json --bot my-bot -o comment.md --fetch-links
    """
    from kvtrace.analyze.views.reply import reply

    result = parse_or_fail(thread, progress, link_policy(fetch_links, github_url, api_url))
    if result.thread is None:
        fail(f"{thread}: not a GitHub thread (gh issue view N --json title,body,comments,url, or the REST API's "
             "issue and comments)")
    r = reply(result, bot)
    try:
        out.write_text(r.body, encoding="utf-8")
    except OSError as exc:
        fail(f"{out}: cannot write: {exc.strerror or exc}")
    click.echo(json.dumps(r.to_dict()))
