"""`verispec serve --replicas 2` on a local Ray instance (Ray Serve), the tiny random pair in each replica.

Everything runs for real: `python -m verispec serve` processes, Ray, HTTP on 127.0.0.1, the official openai
client. The single-process server on the same models is the reference every cluster answer must equal. Marked
`cluster` (part of the default run; `-m "not cluster"` skips them, docs/cluster.md); skipped without Ray.
Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serving import REQUEST_TIMEOUT, ServerProcess

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[cluster]')")
openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # local Ray clusters: about 90 s

KEY = "cluster-key"
TINY = ("--model", "tiny", "--speculative-model", "tiny", "--max-model-len", "512", "--threads", "1")
PROMPTS = ["hello world", "def fibonacci(n):", "The capital of France is", "x = [1, 2, 3]\nfor"]
MAX_TOKENS = 24
SHARED_PREFIX = "You are a careful assistant. " * 11  # 319 characters: 2 prefill chunks (byte tokens), 1 routing block
RECOVERY_SECONDS = 90.0


def _cluster(*flags: str, replicas: int = 2) -> ServerProcess:
    """A cluster server once the ingress's router lists all `replicas`: /health answers as soon as one engine
    replica is up, and until the others are the ingress admits only what the live ones hold (docs/cluster.md,
    Starting)."""
    proc = ServerProcess("--replicas", str(replicas), *flags, *TINY)

    def live() -> bool:
        return sum(key.startswith("verispec_cluster_replica_info{") for key in _metrics(proc)) == replicas

    try:
        _wait_for(live, RECOVERY_SECONDS, f"{replicas} replicas up")
    except AssertionError:
        proc.stop()
        raise
    return proc


@pytest.fixture(scope="module")
def cluster() -> Iterator[ServerProcess]:
    proc = _cluster("--api-key", KEY)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def single() -> Iterator[ServerProcess]:
    proc = ServerProcess("--api-key", KEY, *TINY)
    yield proc
    proc.stop()


def _client(proc: ServerProcess, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=proc.url + "/v1", api_key=key, timeout=REQUEST_TIMEOUT, max_retries=0)


def _metrics(proc: ServerProcess) -> dict[str, float]:
    return proc.metrics()  # with the key: /metrics needs it, as in the single-process server


def _by_replica(values: dict[str, float], name: str) -> dict[str, float]:
    """{replica id: value} of an unlabelled per-replica series, e.g. verispec_prefill_reused_tokens_total."""
    prefix = f"{name}{{replica="
    return {key[len(prefix) : -1]: value for key, value in values.items() if key.startswith(prefix)}


def _settled_metrics(proc: ServerProcess, names: tuple[str, ...], timeout: float = 15.0) -> dict[str, float]:
    """The merged /metrics once two reads 1.5 s apart agree on the series `names`: replicas report about every
    second, so a read right after earlier requests may still lack some of their counts (it once made those look
    like the counts of the test that read it)."""

    def watched(values: dict[str, float]) -> dict[str, float]:
        return {key: value for key, value in values.items() if key.startswith(names)}

    previous = _metrics(proc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1.5)
        current = _metrics(proc)
        if watched(current) == watched(previous):
            return current
        previous = current
    raise AssertionError(f"/metrics did not settle within {timeout} s")


def _replica_pids(proc: ServerProcess) -> dict[str, int]:
    values = _metrics(proc)
    pids = {}
    for key in values:
        if key.startswith("verispec_cluster_replica_info{"):
            labels = dict(part.split("=", 1) for part in key[key.index("{") + 1 : -1].split(","))
            if labels.get("pid"):
                pids[labels["replica"]] = int(labels["pid"])
    return pids


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s: {what}")


def _answers(proc: ServerProcess) -> list[str]:
    client = _client(proc)
    texts = []
    for prompt in PROMPTS:
        plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        stream = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        messages = [{"role": "user", "content": prompt}]
        chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
        texts += [plain.choices[0].text, streamed, chat.choices[0].message.content]
    return texts


def test_greedy_answers_equal_the_single_process_servers(cluster: ServerProcess, single: ServerProcess):
    expected = _answers(single)
    assert all(expected) and len(set(expected)) > 1
    assert _answers(cluster) == expected


def test_the_api_key_is_enforced_through_the_ingress(cluster: ServerProcess):
    with pytest.raises(openai.AuthenticationError) as refused:
        _client(cluster, "wrong").completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    response = httpx.post(cluster.url + "/v1/completions", json={"prompt": "hi"}, timeout=10)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    bad_host = httpx.get(cluster.url + "/health", headers={"Host": "evil.example"}, timeout=10)
    assert bad_host.status_code == 400 and bad_host.json()["error"]["code"] == "invalid_host"
    assert httpx.get(cluster.url + "/health", timeout=10).json() == {"status": "ok"}
    assert httpx.get(cluster.url + "/metrics", timeout=10).status_code == 401  # replicas' processes are listed there
    values = _metrics(cluster)
    assert values["verispec_cluster_rejected_requests_total{code=invalid_api_key}"] >= 1
    assert values["verispec_cluster_rejected_requests_total{code=missing_api_key}"] >= 1


def test_requests_sharing_a_prefix_land_on_the_replica_holding_it(cluster: ServerProcess):
    _wait_for(lambda: len(_replica_pids(cluster)) == 2, 30, "both replicas report their metrics")
    # the earlier tests' requests counted first, so that they are not counted as this test's
    settled = _settled_metrics(cluster, ("verispec_prefill_reused_tokens_total", "verispec_cluster_prefix_routed"))
    before = _by_replica(settled, "verispec_prefill_reused_tokens_total")
    hits_before = settled.get("verispec_cluster_prefix_routed_total{outcome=hit}", 0.0)
    client = _client(cluster)
    for i in range(6):
        client.completions.create(model="tiny", prompt=f"{SHARED_PREFIX}question {i}:", max_tokens=4, temperature=0)

    def reuse_settled():
        now = _by_replica(_metrics(cluster), "verispec_prefill_reused_tokens_total")
        grown = {r: v - before.get(r, 0.0) for r, v in now.items() if v > before.get(r, 0.0)}
        return grown if sum(grown.values()) >= 5 * 256 else None  # 2 chunks of 128 reused by requests 2-6

    grown = _wait_for(reuse_settled, 30, "the replicas' metrics show the prefill reuse")
    assert len(grown) == 1, f"the prefix's prefill was reused on more than one replica: {grown}"
    values = _metrics(cluster)
    assert values["verispec_cluster_prefix_routed_total{outcome=hit}"] - hits_before == 5
    assert values["verispec_cluster_prefix_hit_rate"] >= 0.9


def test_a_killed_replica_leaves_the_other_requests_served_and_comes_back(cluster: ServerProcess):
    pids = _wait_for(lambda: (p := _replica_pids(cluster)) and len(p) == 2 and p, 30, "two replicas")
    client = _client(cluster)
    started = threading.Semaphore(0)
    outcomes: list[str] = []

    def stream(i: int) -> None:
        try:
            chunks = client.completions.create(
                model="tiny", prompt=f"stream {i}", max_tokens=400, temperature=0, stream=True,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            for n, _ in enumerate(chunks):
                if n == 1:
                    started.release()
            outcomes.append("complete")
        except openai.APIStatusError as exc:  # an HTTP status: the target allows none >= 500
            outcomes.append(f"status {exc.status_code}")
        except openai.APIError as exc:  # an SSE error event: the replica died under this stream
            outcomes.append("error event" if "replica" in str(exc) else f"other: {exc}")

    def plain(i: int) -> None:
        try:
            reply = client.completions.create(model="tiny", prompt=f"plain {i}", max_tokens=200, temperature=0)
            outcomes.append("complete" if reply.choices[0].text is not None else "empty")
        except openai.APIError as exc:
            outcomes.append(f"plain failed: {exc}")

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(16)]
    threads += [threading.Thread(target=plain, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(8):
        assert started.acquire(timeout=60), "streams did not start"
    victim = sorted(pids.items())[0]
    os.kill(victim[1], signal.SIGKILL)
    for thread in threads:
        thread.join(REQUEST_TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a request hangs"
    assert len(outcomes) == 20
    assert all(o in ("complete", "error event") for o in outcomes), outcomes
    assert outcomes.count("complete") >= 4 + 1  # the plain requests (retried if need be) and the other replica's

    def replaced():
        now = _replica_pids(cluster)
        return len(now) == 2 and victim[1] not in now.values()

    _wait_for(replaced, RECOVERY_SECONDS, "Ray restarts the killed replica")
    reply = client.completions.create(model="tiny", prompt="after", max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens == 4


def test_429_with_retry_after_when_every_replica_is_full():
    proc = _cluster("--max-num-seqs", "1", "--max-queue", "1")
    try:

        def one(i: int) -> httpx.Response:
            body = {"prompt": f"p{i}", "max_tokens": 480, "temperature": 0, "ignore_eos": True}
            return httpx.post(proc.url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT)

        with ThreadPoolExecutor(12) as pool:
            replies = list(pool.map(one, range(12)))
    finally:
        proc.stop()
    statuses = sorted(r.status_code for r in replies)
    assert set(statuses) == {200, 429}, statuses  # never a 5xx, never a wait without end
    assert statuses.count(200) >= 5  # each replica's slot and queue place (2 x 2), the ingress's queue place
    for refused in (r for r in replies if r.status_code == 429):
        assert refused.headers["retry-after"] == "1" and refused.json()["error"]["code"] == "queue_full"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--replicas", "0"], "--replicas must be >= 1, got 0"),
        (["--ray-address", "auto"], "--ray-address needs --replicas N"),
        (["--replicas", "2", "--min-replicas", "3", "--max-replicas", "4"], "need 0 <= --min-replicas <= --replicas"),
        (["--replicas", "1", "--ray-address", "127.0.0.1:1"], "cannot join the Ray cluster at '127.0.0.1:1'"),
    ],
)
def test_a_mistake_is_one_line_and_exit_2(flags: list[str], message: str):
    command = [sys.executable, "-m", "verispec", "serve", *TINY, *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
