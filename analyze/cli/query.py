"""`kvtrace query`: SQL (DuckDB) over a dataset that `kvtrace parse --dataset` wrote, or parsed sessions."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kvtrace.analyze.cli.options import fail


@click.command("query")
@click.argument("sql", metavar="SQL")
@click.argument("folders", nargs=-1, metavar="[DATASET|SESSION...]",
                type=click.Path(file_okay=False, path_type=Path))
@click.option("--csv", "as_csv", is_flag=True, help="The rows as CSV.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
def query_command(sql: str, folders: tuple[Path, ...], as_csv: bool, as_json: bool) -> None:
    """Run SQL over parsed logs with DuckDB: the tables batches, kv, errors, events, meta (key, value) and
    verdicts (one row per log: kind, component, signature, spec_type, build, seq_id, last_pos = X,
    batch_start = Y, acceptance, synthetic (the server made the acceptance up), n_stale_trims, error...) each
    have a `source` column naming the log. FOLDERS are datasets
    (kvtrace parse --dataset / --scheduler) or session and tables folders that kvtrace parse wrote;
    default: the current folder. Needs kvtrace[cluster].

    \b
    Examples:
      # which reports fail on the drafter with X < Y
      kvtrace query "SELECT source, signature, last_pos AS x, batch_start AS y FROM verdicts
                     WHERE component = 'drafter' AND last_pos < batch_start" fleet.kvt
      # the drafters' acceptance per spec type and build (synthetic runs left out)
      kvtrace query "SELECT spec_type, build, count(*) AS logs, sum(accepted) / sum(generated) AS acceptance
                     FROM verdicts WHERE NOT synthetic GROUP BY ALL ORDER BY logs DESC" fleet.kvt --csv
      # the logs with the most failures
      kvtrace query "SELECT source, count(*) AS failures FROM errors GROUP BY source ORDER BY 2 DESC" fleet.kvt
      # the logs that could not be read
      kvtrace query "SELECT source, error FROM verdicts WHERE error IS NOT NULL" fleet.kvt --json
    """
    from kvtrace.analyze.fleet.dataset import DatasetError, query

    if as_csv and as_json:
        fail("--csv and --json: choose one")
    try:
        df = query(sql, list(folders) or [Path(".")])
    except DatasetError as exc:
        fail(str(exc))
    if as_csv:
        click.echo(df.to_csv(index=False), nl=False)
    elif as_json:
        for record in json.loads(df.to_json(orient="records", date_format="iso")):
            click.echo(json.dumps(record))
    elif df.empty:
        click.echo(f"(no rows; columns: {', '.join(map(str, df.columns))})")
    else:
        click.echo(df.to_string(index=False))
