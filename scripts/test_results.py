#!/usr/bin/env python3
"""Tests of scripts/results.py: the page and plots are the same bytes for the same receipts
whatever the order the files are listed or written in, the committed page is what the committed
receipts give, ratios and "latest" follow the receipts, null figures show as a dash, the SVG is
well-formed XML, and a bad receipt is refused with its file named.

Run: python3 -m unittest discover -s scripts -p 'test_*.py'
"""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402

HOST = {"vendor": "GenuineIntel", "model_name": "Test CPU", "cpu_family": 6, "cpu_model": 1,
        "cpus": 2, "isa": "avx2", "flags": ["avx2"]}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def receipt(kind="bench", date=None, peer=None, figures=None, **kw):
    r = {"schema": "aubier-receipt/1", "kind": kind, "date": date, "command": None,
         "commit": None, "host": HOST, "backend": "cpu (q8x2)", "device": None,
         "model": "m.gguf", "peer": peer, "figures": figures or {}, "source": None}
    r.update(kw)
    return r


def speed(prefill, decode):
    return {"prefill_tok_s": {"median": prefill, "min": None, "max": None},
            "decode_tok_s": {"median": decode, "min": None, "max": None},
            "n_prompt": 512, "n_gen": 128}


class Generator(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.bench = os.path.join(self.dir, "bench")
        os.mkdir(self.bench)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write(self, name, r):
        with open(os.path.join(self.bench, name), "w") as f:
            json.dump(r, f)

    def run_main(self, *args):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = results.main(["--receipts", self.bench,
                                 "--out", os.path.join(self.dir, "RESULTS.md"), *args])
        return code, err.getvalue()

    def page(self):
        return read(os.path.join(self.dir, "RESULTS.md"))

    def test_same_bytes_whatever_the_file_order(self):
        receipts = {
            "b.json": receipt(date="2026-01-02T00:00Z", figures=speed(300.0, 30.0),
                              peer=speed(200.0, 20.0)),
            "a.json": receipt(date="2026-01-01", figures=speed(100.0, 10.0),
                              peer=speed(200.0, 20.0)),
            "r.json": receipt(kind="replay", backend=None, model="synthetic x",
                              figures=[{"slots": 8, "policies": {"2q": 0.5, "min": 0.75}},
                                       {"slots": 4, "policies": {"2q": 0.25, "min": 0.5}}]),
        }
        snapshots = []
        for order in (sorted(receipts), sorted(receipts, reverse=True)):
            for name in os.listdir(self.bench):
                os.remove(os.path.join(self.bench, name))
            for name in order:
                self.write(name, receipts[name])
            self.assertEqual(self.run_main(), (0, ""))
            plots = os.path.join(self.dir, "results")
            snapshots.append((self.page(), {n: read(os.path.join(plots, n))
                                            for n in sorted(os.listdir(plots))}))
            self.assertEqual(self.run_main("--check"), (0, ""))
        self.assertEqual(snapshots[0], snapshots[1])
        page, plots = snapshots[0]
        self.assertEqual(len(plots), 2)
        for svg in plots.values():
            ET.fromstring(svg)

    def test_latest_receipt_ratio_range_and_dashes(self):
        self.write("old.json", receipt(date="2026-01-01", figures=speed(100.0, 10.0),
                                       peer=speed(200.0, 20.0)))
        self.write("new.json", receipt(date="2026-01-02T00:00Z", figures=speed(300.0, None),
                                       peer=speed(200.0, 20.0)))
        self.assertEqual(self.run_main(), (0, ""))
        row = [line for line in self.page().splitlines() if line.startswith("| Test CPU")]
        self.assertEqual(len(row), 1, row)
        cells = [c.strip() for c in row[0].strip("|").split("|")]
        # The newer receipt: prefill 300 against 200 is 1.50×; its decode is unknown.
        self.assertEqual(cells[5:11], ["300.0", "200.0", "**1.50×**", "—", "20.00", "—"])
        # Ranges over both receipts: prefill 0.50 and 1.50; decode only the old one's 0.50.
        self.assertEqual(cells[11:13], ["0.50–1.50× (2)", "0.50–0.50× (1)"])
        self.assertIn("new.json", cells[-1])

    def test_vulkan_receipts_have_their_own_table_with_the_device(self):
        self.write("cpu.json", receipt(date="2026-01-01", figures=speed(100.0, 10.0),
                                       peer=speed(200.0, 20.0)))
        self.write("vk.json", receipt(date="2026-01-02", backend="vulkan", device="lavapipe",
                                      figures=speed(0.6, 0.12), peer=speed(0.45, 0.1)))
        self.assertEqual(self.run_main(), (0, ""))
        page = self.page()
        cpu = page.index("## Speed against llama.cpp (CPU)")
        vulkan = page.index("## Speed against llama.cpp's Vulkan backend (same device)")
        after = page.index("## Speed by backend")
        rows = [line for line in page[cpu:vulkan].splitlines() if line.startswith("| Test CPU")]
        self.assertEqual(len(rows), 1, rows)
        self.assertNotIn("vk.json", rows[0])
        rows = [line for line in page[vulkan:after].splitlines() if line.startswith("| Test CPU")]
        self.assertEqual(len(rows), 1, rows)
        cells = [c.strip() for c in rows[0].strip("|").split("|")]
        # backend, device; then prefill 0.6 against 0.45 is 1.33×, decode 0.12 against 0.1 1.20×.
        self.assertEqual(cells[2:4], ["vulkan", "lavapipe"])
        self.assertEqual(cells[6:12], ["0.60", "0.45", "**1.33×**", "0.12", "0.10", "**1.20×**"])
        self.assertIn("vk.json", cells[-1])

    def test_check_reports_a_stale_page(self):
        self.write("a.json", receipt(figures=speed(1.0, 1.0)))
        self.assertEqual(self.run_main(), (0, ""))
        with open(os.path.join(self.dir, "RESULTS.md"), "a") as f:
            f.write("edited by hand\n")
        code, err = self.run_main("--check")
        self.assertEqual(code, 1)
        self.assertIn("RESULTS.md", err)

    def test_bad_receipts_are_refused_naming_the_file(self):
        cases = {
            "notjson.json": "{",
            "schema.json": json.dumps(dict(receipt(), schema="other/1")),
            "kind.json": json.dumps(receipt(kind="guess")),
            "missing.json": json.dumps({k: v for k, v in receipt().items() if k != "peer"}),
            "date.json": json.dumps(receipt(date="yesterday")),
            "replay.json": json.dumps(receipt(kind="replay", figures=[{"slots": 1}])),
        }
        for name, text in cases.items():
            for old in os.listdir(self.bench):
                os.remove(os.path.join(self.bench, old))
            with open(os.path.join(self.bench, name), "w") as f:
                f.write(text)
            code, err = self.run_main()
            self.assertEqual(code, 2, name)
            self.assertIn(name, err)
            self.assertFalse(os.path.exists(os.path.join(self.dir, "RESULTS.md")), name)


class Committed(unittest.TestCase):
    def test_the_committed_page_is_what_the_receipts_give(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = results.main(["--check"])
        self.assertEqual(code, 0, err.getvalue())


if __name__ == "__main__":
    unittest.main()
