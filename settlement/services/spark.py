"""An embedded Spark standalone cluster on loopback: one master and N one-core workers.

Started from the Spark distribution that ships inside the pyspark wheel
(``pyspark/bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``),
in the foreground under our own pid files (``sbin/start-master.sh`` would daemonise and
write its pid files under /tmp, where ``settle services down`` could not tell ours from
another engineer's). Each worker has its own work directory under the state directory, so
executors fetch jars and Python files from the driver exactly as on separate machines.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settlement.config import Settings
from settlement.services.kafka import java_bin
from settlement.services.procs import (
    PidFile,
    ServiceError,
    ensure_port_free,
    port_open,
    spawn,
    terminate,
    wait_until,
)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """$SPARK_HOME if it is a distribution, else the one inside the pyspark wheel."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "bin" / "spark-class").is_file():
        return Path(home)
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def master_json(settings: Settings, timeout: float = 5.0) -> dict[str, Any]:
    """The master web UI's JSON: workers, running and completed applications."""
    url = f"http://127.0.0.1:{settings.spark_master_ui_port}/json/"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass(frozen=True)
class SparkDaemon:
    settings: Settings
    name: str  # "master", "worker-1", ...

    @property
    def root(self) -> Path:
        return self.settings.state_dir / "spark" / self.name

    @property
    def log(self) -> Path:
        return self.root / f"{self.name}.log"

    @property
    def pidfile(self) -> PidFile:
        return PidFile(self.root / "pid.json")

    def running(self) -> bool:
        return self.pidfile.alive_pid() is not None

    def argv(self) -> list[str]:
        s = self.settings
        cls = str(spark_home() / "bin" / "spark-class")
        # Our own (empty) properties file: no spark-defaults.conf of another installation, and
        # its path in the command line is the pid file's marker.
        props = ["--properties-file", str(self.properties)]
        if self.name == "master":
            return [cls, MASTER_CLASS, "--host", "127.0.0.1", "--port", str(s.spark_master_port),
                    "--webui-port", str(s.spark_master_ui_port), *props]
        # Port 0: the worker's RPC and UI ports are picked free by the OS (several engineers
        # share the host; fixed worker ports would collide).
        return [cls, WORKER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                "--cores", str(s.spark_worker_cores), "--memory", s.spark_worker_memory,
                "--work-dir", str(self.root / "work"), *props, s.spark_cluster_url]

    @property
    def properties(self) -> Path:
        return self.root / "conf" / "spark-defaults.conf"

    def env(self) -> dict[str, str]:
        home = spark_home()
        return {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
                "JAVA_HOME": str(Path(java_bin()).resolve().parents[1]),
                # The daemons themselves are small; executors get spark.executor.memory.
                "SPARK_DAEMON_MEMORY": "256m",
                # No spark-defaults.conf or spark-env.sh of another installation.
                "SPARK_CONF_DIR": str(self.root / "conf"),
                "SPARK_LOG_DIR": str(self.root), "SPARK_PID_DIR": str(self.root)}

    def start(self) -> subprocess.Popen[bytes]:
        (self.root / "work").mkdir(parents=True, exist_ok=True)
        self.properties.parent.mkdir(parents=True, exist_ok=True)
        self.properties.write_text("# written by settle services up --spark-cluster\n")
        # The marker names this daemon's own state folder: never another cluster's process.
        return spawn(self.argv(), self.log, self.pidfile, marker=str(self.properties),
                     env=self.env())

    def stop(self) -> bool:
        return terminate(self.pidfile, timeout=20)


@dataclass(frozen=True)
class EmbeddedSparkCluster:
    settings: Settings

    @property
    def master(self) -> SparkDaemon:
        return SparkDaemon(self.settings, "master")

    def workers(self) -> list[SparkDaemon]:
        return [SparkDaemon(self.settings, f"worker-{i}")
                for i in range(1, self.settings.spark_workers + 1)]

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in master_json(self.settings).get("workers", [])
                       if w.get("state") == "ALIVE")
        # A master still starting may answer its UI port before its JSON is served (an empty
        # body: CI's `settle services up --spark-cluster` once failed on that
        # JSONDecodeError): not ready yet, as when it does not answer at all.
        except (OSError, ValueError):
            return 0

    def start(self) -> str:
        s = self.settings
        if self.master.running() and not port_open(s.spark_master_port):
            raise ServiceError(
                f"the Spark master of {s.state_dir} runs, but not on port "
                f"{s.spark_master_port} (SETTLE_SPARK_MASTER_PORT changed?): `settle services "
                "down` first")
        if self.master.running() and all(w.running() for w in self.workers()):
            return "already running"
        if not self.master.running():
            ensure_port_free(s.spark_master_port, "SETTLE_SPARK_MASTER_PORT")
            ensure_port_free(s.spark_master_ui_port, "SETTLE_SPARK_MASTER_UI_PORT")
            proc = self.master.start()
            wait_until(lambda: port_open(s.spark_master_port)
                       and port_open(s.spark_master_ui_port), 60, "Spark master",
                       self.master.log, alive=lambda: proc.poll() is None)
        for w in self.workers():
            if not w.running():
                w.start()
        wait_until(lambda: self.alive_workers() >= s.spark_workers, 90,
                   f"{s.spark_workers} Spark workers registering with the master",
                   self.workers()[0].log)
        return "started"

    def stop(self) -> bool:
        stopped = [w.stop() for w in self.workers()]
        return self.master.stop() or any(stopped)

    def status(self) -> dict[str, Any]:
        return {"master": "running" if self.master.running() else "stopped",
                "spark_master_url": self.settings.spark_cluster_url,
                "spark_master_ui": f"http://127.0.0.1:{self.settings.spark_master_ui_port}",
                "workers_alive": self.alive_workers() if self.master.running() else 0}
