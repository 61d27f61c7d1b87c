"""A libzmq (pyzmq) peer for vllmzmq's interop test.

mode "publish": behaves on the wire as vLLM's ZmqEventPublisher: a PUB socket
sending (topic, 8-byte big-endian sequence from 0, payload) and a ROUTER
answering (identity, b"", start) with (identity, b"", seq, payload) for every
buffered batch with seq >= start, then (identity, b"", -1 as 8 signed bytes,
b""). Payloads are hex lines on stdin; a line "drop <hex>" buffers a batch
without sending it (a gap). It prints "ready" once bound, publishes when it
reads "go", answers replay requests until stdin closes.

mode "subscribe": a libzmq SUB and a DEALER replay client against a publisher
(the Go one): prints every received event as "event <topic hex> <seq> <payload
hex>" until it has N, then asks for replay from START and prints each reply as
"replay <frame hex>|<frame hex>|..." until the end marker.
"""
import sys
import threading
import time
from collections import deque

import zmq


def publish(pub_ep, replay_ep, topic):
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.bind(pub_ep)
    router = ctx.socket(zmq.ROUTER)
    router.bind(replay_ep)
    buf = deque(maxlen=10_000)
    lock = threading.Lock()
    lines = [l.strip() for l in sys.stdin if l.strip()]
    print("ready", flush=True)
    # Give the Go SUB time to connect and subscribe (slow joiner).
    time.sleep(1.0)
    seq = 0
    for line in lines:
        drop = line.startswith("drop ")
        payload = bytes.fromhex(line.split()[-1])
        with lock:
            if not drop:
                pub.send_multipart((topic.encode(), seq.to_bytes(8, "big"), payload))
            buf.append((seq, payload))
        seq += 1
        time.sleep(0.02)
    end = (-1).to_bytes(8, "big", signed=True)
    deadline = time.time() + 30  # the test kills it sooner
    while time.time() < deadline:
        if router.poll(100):
            frames = router.recv_multipart()
            if len(frames) != 3:
                continue
            ident, _, start = frames
            start = int.from_bytes(start, "big")
            with lock:
                items = [(s, p) for s, p in buf if s >= start]
            for s, p in items:
                # vLLM 0.32: topic, sequence, payload; the end marker has an empty topic.
                router.send_multipart((ident, b"", topic.encode(), s.to_bytes(8, "big"), p))
            router.send_multipart((ident, b"", b"", end, b""))
            print("served", start, len(items), flush=True)
    pub.close(linger=0)
    router.close(linger=0)


def subscribe(pub_ep, replay_ep, topic, n, start):
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.connect(pub_ep)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    print("ready", flush=True)
    got = 0
    while got < n:
        if not sub.poll(10_000):
            print("timeout", flush=True)
            return
        t, s, p = sub.recv_multipart()
        print("event", t.hex(), int.from_bytes(s, "big"), p.hex(), flush=True)
        got += 1
    # A DEALER, not a REQ: libzmq's REQ takes one reply per request, and
    # vLLM's replay answers one request with many messages.
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_ep)
    dealer.send_multipart((b"", start.to_bytes(8, "big")))
    while dealer.poll(5_000):
        frames = dealer.recv_multipart()
        print("replay", "|".join(f.hex() for f in frames), flush=True)
        if frames[1] == (-1).to_bytes(8, "big", signed=True):
            break
    sub.close(linger=0)
    dealer.close(linger=0)


if __name__ == "__main__":
    if sys.argv[1] == "publish":
        publish(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        subscribe(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
