"""POST /shoal/plan on a live two-node cluster gives each placement one node serves alone
the other node's split rows (prefill there, the KV over their measured link, first token
here) at each prompt length the hand-over takes, the same figures `shoal plan --json`
prints; alike machines never pay, so ranked for agents no placement names a prefill
node."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from nodes import ROOT, start_cluster


def test_the_plan_gives_each_lone_placement_its_split_rows(tmp_path, tiny_model_dir):
    a, b = start_cluster(tmp_path, tiny_model_dir, 2)
    try:
        ids = [a.client.status().cluster.id, b.client.status().cluster.id]
        body = {"model": "tiny-llama", "prompt_tokens": [1000, 2000, 4000], "rank": "agents"}
        r = httpx.post(a.url + "/shoal/plan", json=body, timeout=60)
        assert r.status_code == 200, r.text
        placements = r.json()["placements"]
        alone = [p for p in placements if len(p["ranks"]) == 1]
        assert {p["ranks"][0]["node"] for p in alone} == set(ids)
        for p in placements:
            # alike machines: prefilling elsewhere only adds
            assert p["prefill"] is None and p["prefill_min"] is None
            if len(p["ranks"]) > 1:
                assert p["split_prefill"] == []
                continue
            other = ids[1 - ids.index(p["ranks"][0]["node"])]
            rows = p["split_prefill"]
            # 1000 tokens is under the hand-over's minimum; 2000 and 4000 are split
            assert [(x["node_id"], x["prompt"]) for x in rows] == [(other, 2000),
                                                                   (other, 4000)]
            for x in rows:
                assert not x["pays"] and x["split_s"] > x["alone_s"] > 0
                assert x["prefill_s"] + x["transfer_s"] < x["split_s"]
                assert x["kv_bytes"] > 0 and x["transfer_s"] > 0
            # the alone time is the placement's own predicted first token
            own = {t["prompt_tokens"]: t["seconds"] for t in p["ttft"]}
            assert [x["alone_s"] for x in rows] == pytest.approx([own[2000], own[4000]])

        cli = subprocess.run([sys.executable, "-m", "app.cli", "plan", "tiny-llama", "--url",
                              a.url, "--prompts", "1000,2000,4000", "--rank", "agents",
                              "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        printed = {tuple(r["node"] for r in p["ranks"]): p["split_prefill"]
                   for p in json.loads(cli.stdout)["placements"]}
        for p in alone:
            theirs = printed[(p["ranks"][0]["node"],)]
            # the same planner on the same inputs, asked again: the nodes' free memory
            # and the link's measurement move a little meanwhile
            for mine, cli_row in zip(p["split_prefill"], theirs, strict=True):
                for key in ("node", "node_id", "prompt", "kv_bytes"):
                    assert mine[key] == cli_row[key], key
                for key in ("alone_s", "prefill_s"):
                    assert mine[key] == pytest.approx(cli_row[key], rel=1e-3), key
                assert mine["transfer_s"] == pytest.approx(cli_row["transfer_s"], rel=1)
    finally:
        a.stop()
        b.stop()
