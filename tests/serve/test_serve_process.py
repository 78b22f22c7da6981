"""`vitkit serve` as a real uvicorn process on a free loopback port: oversized bodies over a socket,
SIGTERM drains the request in flight and exits 0, a missing checkpoint is a clean CLI error."""

from __future__ import annotations

import json
import select
import signal
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="vitkit serve needs the serve extra: pip install -e '.[serve]'")
httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (in the test extra)")

from serve_helpers import free_port, metric, png_bytes, start_server, stop_server  # noqa: E402 - after the skips

from vitkit.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def server(vit_checkpoint: Path, tmp_path_factory):
    process, url = start_server(vit_checkpoint, tmp_path_factory.mktemp("server") / "log.txt", "--max-body-mb", "1")
    yield url
    assert stop_server(process) == 0


def _raw_request(url: str, head: str, body_chunks: int = 0) -> bytes:
    """Send a request head, then up to `body_chunks` 64 KiB chunks while no answer has come; return the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode())
        chunk = b"10000\r\n" + b"\0" * 0x10000 + b"\r\n"  # one 64 KiB chunk of a chunked body
        for _ in range(body_chunks):
            if select.select([sock], [], [], 0)[0]:
                break  # the answer is already there: the server stopped reading
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        return _read_answer(sock)


def _read_answer(sock: socket.socket) -> bytes:
    """Head and body of one HTTP answer (the body by its Content-Length)."""
    answer = b""
    while True:
        head, _, body = answer.partition(b"\r\n\r\n")
        length = [
            int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")
        ]
        if length and len(body) >= length[0]:
            return answer
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return answer
        if not data:
            return answer
        answer += data


def test_oversized_bodies_are_refused_without_being_read(server: str) -> None:
    declared = _raw_request(
        server, "POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 1073741824\r\n\r\n"
    )  # 1 GiB announced, not a byte sent
    assert declared.startswith(b"HTTP/1.1 413") and b'"error"' in declared
    streamed = _raw_request(
        server,
        "POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nTransfer-Encoding: chunked\r\n\r\n",
        body_chunks=256,
    )  # up to 16 MiB
    assert streamed.startswith(b"HTTP/1.1 413") and b"exceeds the limit" in streamed
    health = httpx.get(f"{server}/health", timeout=5)
    assert health.status_code == 200
    ok = httpx.post(
        f"{server}/v1/predict", content=png_bytes(32, 32), headers={"Content-Type": "image/png"}, timeout=10
    )
    assert ok.status_code == 200 and len(ok.json()["predictions"]) == 3


def test_sigterm_drains_the_request_in_flight_and_exits_zero(vit_checkpoint: Path, tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    process, url = start_server(vit_checkpoint, log)
    host, port = url.removeprefix("http://").split(":")
    image = png_bytes(32, 32)
    head = f"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: {len(image)}\r\n\r\n"
    try:
        children = _children(process.pid)  # the model process, and multiprocessing's resource tracker
        assert (
            sum(b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children) == 1
        )  # the model's own
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head.encode() + image[: len(image) // 2])  # in flight: half its body sent
            for _ in range(200):
                if metric(httpx.get(f"{url}/metrics", timeout=5).text, "vitkit_requests_in_flight") == 1:
                    break
                time.sleep(0.01)
            else:
                raise AssertionError("the request never arrived")
            process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            with pytest.raises(httpx.TransportError):  # no new connections once draining
                httpx.get(f"{url}/health", timeout=2)
            sock.sendall(image[len(image) // 2 :])  # the rest arrives after SIGTERM: still answered
            answer = _read_answer(sock)
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert len(json.loads(answer.split(b"\r\n\r\n", 1)[1])["predictions"]) == 3
    assert code == 0, log.read_text()
    assert "drained and stopped" in log.read_text()
    for _ in range(500):  # they end with the server (orphans a moment later)
        if not any(_running(pid) for pid in children):
            break
        time.sleep(0.01)
    assert not any(_running(pid) for pid in children)


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended, only not been reaped
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    return [
        int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in (task / "children").read_text().split()
    ]


def test_serve_on_a_missing_checkpoint_is_a_clean_error(tmp_path: Path, capsys) -> None:
    assert main(["serve", str(tmp_path / "nowhere"), "--port", str(free_port())]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_serve_on_a_folder_that_is_no_checkpoint_stops_before_binding(tmp_path: Path, capsys, caplog) -> None:
    """A folder of images (a common slip) is named as no checkpoint before the server reports it runs."""
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "cat" / "a.jpg").write_bytes(b"\xff\xd8\xff")
    assert main(["serve", str(tmp_path / "photos"), "--port", str(free_port())]) == 2
    assert "not a checkpoint directory" in capsys.readouterr().err
    assert "Uvicorn running" not in caplog.text


@pytest.mark.parametrize("damage", ["truncated", "altered"])
def test_serve_on_a_damaged_checkpoint_stops_before_binding(tmp_path: Path, capsys, caplog, damage: str) -> None:
    """A weights file cut short by a copy, or altered after it was written, was found by the model process
    after the server had said it runs: uvicorn's start-up and shut-down lines around one error, exit 1."""
    import vitkit

    weights = (
        vitkit.save(vitkit.create_model("vit_ti16", img_size=16, num_classes=2), tmp_path / "m") / "model.safetensors"
    )
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else data[:-4] + b"\x7f\x7f\x7f\x7f")
    assert main(["serve", str(tmp_path / "m"), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    why = "the file holds" if damage == "truncated" else "SHA-256"
    assert str(weights) in err and why in err and "Uvicorn running" not in caplog.text


def test_serve_on_a_device_this_host_has_not_stops_before_binding(tmp_path: Path, capsys, caplog) -> None:
    """--device tpu started the server, failed in its start-up and exited 1."""
    import vitkit

    vitkit.save(vitkit.create_model("vit_ti16", img_size=16, num_classes=2), tmp_path / "m")
    assert main(["serve", str(tmp_path / "m"), "--port", str(free_port()), "--device", "tpu"]) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err and "Uvicorn running" not in caplog.text


def test_serve_on_an_encoder_without_a_head_stops_before_binding(tmp_path: Path, capsys, caplog) -> None:
    """A pretrain-mpp encoder bound the port, started uvicorn, then exited 1 with "has no classification head";
    eval and predict refuse it at once (exit 2), and so does serve now, where config.json says so."""
    import vitkit

    vitkit.save(vitkit.create_model("vit_ti16", img_size=16, num_classes=0), tmp_path / "encoder")
    assert main(["serve", str(tmp_path / "encoder"), "--port", str(free_port())]) == 2
    assert "has no classification head" in capsys.readouterr().err and "Uvicorn running" not in caplog.text


def test_serve_on_an_address_it_cannot_bind_stops_before_loading(tmp_path: Path, capsys, caplog) -> None:
    """A port in use or a host that is no address here ended in uvicorn's bare socket error, exit 1,
    after the model had loaded; the flag at fault is named instead, before anything starts."""
    import vitkit

    vitkit.save(vitkit.create_model("vit_ti16", img_size=16, num_classes=2), tmp_path / "m")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert main(["serve", str(tmp_path / "m"), "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert f"cannot serve on 127.0.0.1 port {port}: Address already in use; another process" in err
        assert "choose another --port" in err
    assert main(["serve", str(tmp_path / "m"), "--host", "999.1.1.1", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "--host 999.1.1.1: " in err and "0.0.0.0 for every interface" in err
    assert main(["serve", str(tmp_path / "m"), "--host", "192.0.2.1", "--port", str(free_port())]) == 2
    assert "no interface of this machine has that address: see --host" in capsys.readouterr().err
    assert "Uvicorn running" not in caplog.text and "model loaded" not in caplog.text.lower()


def test_a_request_refused_before_any_route_is_in_the_metrics(server: str) -> None:
    """A malformed request is answered by the connection's protocol, which the app's metrics never saw."""
    from prometheus_client.parser import text_string_to_metric_families

    def refused_400() -> float:
        text = httpx.get(f"{server}/metrics", timeout=5).text
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        return sum(
            s.value for s in samples if s.name == "vitkit_refused_requests_total" and s.labels == {"status": "400"}
        )

    before = refused_400()
    assert _raw_request(server, "\x00\x01 GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert refused_400() == before + 1


@pytest.mark.parametrize("to", ["timm", "hf", "official"])
def test_serve_on_a_foreign_encoder_without_a_head_stops_before_binding(
    tmp_path: Path, capsys, caplog, to: str
) -> None:
    """Only a vitkit checkpoint's config.json stated its head before the bind: a timm, HF or official file without
    one bound the port, started uvicorn and exited 1.  Their headers say it too (no head tensor)."""
    import vitkit
    from vitkit.checkpoints import Checkpoint, checked, write

    encoder = vitkit.create_model("vit_ti16", img_size=16, patch_size=8, hidden_size=32, depth=1, num_heads=2,
                                  mlp_dim=64, num_classes=0)  # fmt: skip
    written = write(Checkpoint(model=encoder), tmp_path / f"encoder-{to}", to=to)
    assert checked(written)[1] == encoder.config
    assert main(["serve", str(written), "--port", str(free_port())]) == 2
    assert "has no classification head" in capsys.readouterr().err and "Uvicorn running" not in caplog.text


def test_what_a_foreign_header_makes_us_assume_is_said_once(tmp_path: Path, monkeypatch, caplog) -> None:
    """The check before the bind and the model process each read a timm file's header, and each said its guessed
    head count: the check now says nothing of it, and the model process's load says it."""
    from safetensors.torch import save_file

    import vitkit
    from vitkit.checkpoints import Checkpoint, timm
    from vitkit.serve import server
    from vitkit.serve.model import load_model

    model = vitkit.create_model("vit_ti16", img_size=16, patch_size=8, num_classes=2)
    written = tmp_path / "m.safetensors"  # timm's weights alone: no config.json to give the head count
    save_file(dict(timm.from_vitkit(Checkpoint(model=model))), str(written))
    monkeypatch.setattr(server, "run_server", lambda found, config: 0)  # the model process is not started
    with caplog.at_level("WARNING", logger="vitkit"):
        assert main(["serve", str(written), "--port", str(free_port())]) == 0
        assert "num_heads is not recorded" not in caplog.text
        load_model(written, "cpu")
    assert caplog.text.count("num_heads is not recorded") == 1
