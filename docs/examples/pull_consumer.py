#!/usr/bin/env python3
"""A consumer of a hookrelay pull destination, with Python's standard library only.

It leases deliveries, handles each, and acknowledges those it handled; one whose
handling failed is nacked (due again after a delay). If the consumer dies while
holding a lease, the lease expires and the deliveries are leased again: handle each
delivery idempotently, keyed by its `delivery_id` (the same on every lease).

    HOOKRELAY_URL=http://relay.internal:8080 HOOKRELAY_PULL_TOKEN=... \
        python3 pull_consumer.py feed
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

BASE = os.environ.get("HOOKRELAY_URL", "http://127.0.0.1:8080")
TOKEN = os.environ["HOOKRELAY_PULL_TOKEN"]


def post(path, body=None):
    """POSTs to the relay's public listener; (status, JSON answer)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(BASE + path, data=data, method="POST")
    req.add_header("Authorization", "Bearer " + TOKEN)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def handle(delivery):
    """Your work. Raise to have the delivery tried again later."""
    print(delivery["delivery_id"], delivery["event"], delivery["body"][:80])


def main(destination):
    while True:
        status, leased = post(f"/pull/{destination}/lease?max=100&lease=60s")
        if status != 200:
            print("lease:", status, leased.get("error"), file=sys.stderr)
            time.sleep(5)
            continue
        done, failed = [], []
        for d in leased["deliveries"]:
            try:
                handle(d)
                done.append(d["id"])
            except Exception as e:  # noqa: BLE001 - any failure: try it again later
                print("failed:", d["delivery_id"], e, file=sys.stderr)
                failed.append(d["id"])
        if done:
            status, answer = post(f"/pull/{destination}/ack", {"ids": done})
            for refused in answer.get("refused", []):
                # The lease expired first: the delivery comes back in a later lease.
                print("ack refused:", refused["why"], file=sys.stderr)
        if failed:
            post(f"/pull/{destination}/nack", {"ids": failed, "delay": "30s"})
        if not leased["deliveries"]:
            time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "feed")
