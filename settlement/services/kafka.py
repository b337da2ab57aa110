"""Embedded Apache Kafka (KRaft) on loopback, from Maven Central jars.

`make jars` resolves ``org.apache.kafka:kafka_2.13`` and its runtime dependencies into
``.cache/jars/kafka`` (see jvm/kafka/pom.xml). What ``kafka-storage.sh format`` and
``kafka-server-start.sh`` do is reproduced here with plain ``java -cp``. Each node runs as
combined broker+controller; three nodes form a static controller quorum.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from settlement.config import Settings
from settlement.errors import redact
from settlement.services.procs import (
    PidFile,
    ServiceError,
    ensure_port_free,
    port_open,
    spawn,
    terminate,
    terminate_all,
    wait_until,
    write_private,
)

LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
"""


def java_bin() -> str:
    java = shutil.which("java")
    if java is None:
        raise ServiceError(
            "Java is not installed: Kafka and Spark need a JDK 17 "
            "(Debian: apt-get install openjdk-17-jdk-headless)"
        )
    return java


def kafka_classpath(settings: Settings) -> str:
    jars = settings.jars_dir / "kafka"
    if not any(jars.glob("kafka_2.13-*.jar")):
        raise ServiceError(f"Kafka jars are missing in {jars}: run `make jars` (Maven Central)")
    return f"{jars}/*"


@dataclass(frozen=True)
class KafkaNode:
    settings: Settings
    node_id: int  # 1-based
    cluster_size: int

    @property
    def root(self) -> Path:
        return self.settings.state_dir / "kafka" / f"node-{self.node_id}"

    @property
    def port(self) -> int:
        return self.settings.kafka_port + self.node_id - 1

    @property
    def controller_port(self) -> int:
        return self.settings.kafka_controller_port + self.node_id - 1

    @property
    def config_path(self) -> Path:
        return self.root / "server.properties"

    @property
    def log(self) -> Path:
        return self.root / "broker.log"

    @property
    def pidfile(self) -> PidFile:
        return PidFile(self.root / "broker.pid.json")

    def properties(self) -> str:
        n = self.cluster_size
        s = self.settings
        voters = ",".join(
            f"{i}@127.0.0.1:{s.kafka_controller_port + i - 1}" for i in range(1, n + 1)
        )
        rf = min(3, n)
        isr = min(2, n)
        return "\n".join(
            [
                "process.roles=broker,controller",
                f"node.id={self.node_id}",
                f"controller.quorum.voters={voters}",
                *self._listeners(),
                f"log.dirs={self.root / 'data'}",
                f"num.partitions={s.partitions}",
                f"default.replication.factor={rf}",
                f"min.insync.replicas={isr}",
                f"offsets.topic.replication.factor={rf}",
                f"transaction.state.log.replication.factor={rf}",
                f"transaction.state.log.min.isr={isr}",
                "unclean.leader.election.enable=false",
                "auto.create.topics.enable=false",
                # Sites join at different moments; rebalance at once instead of waiting 3s.
                "group.initial.rebalance.delay.ms=0",
                # Failover drills tune the session timeout down to a few seconds.
                "group.min.session.timeout.ms=1000",
                "log.retention.hours=168",
                "",
            ]
        )

    def _listeners(self) -> list[str]:
        s = self.settings
        name = "SASL_PLAINTEXT" if s.embedded_sasl else "PLAINTEXT"
        lines = [
            f"listeners={name}://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners={name}://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            f"inter.broker.listener.name={name}",
        ]
        if not s.embedded_sasl:
            return lines + [
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"]
        (user, password), mech = s.embedded_kafka_admin(), s.kafka_sasl_mechanism
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
        plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
        return lines + [
            # Clients and brokers authenticate with SCRAM; the users live in the metadata log
            # (the admin is added when storage is formatted, others by `settle kafka init`).
            # SCRAM cannot guard the controller listener (its credentials are not loaded
            # yet when controllers talk), so that one uses PLAIN with a static admin entry:
            # no listener accepts an anonymous client.
            "listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,"
            "CONTROLLER:SASL_PLAINTEXT",
            f"listener.name.sasl_plaintext.sasl.enabled.mechanisms={mech}",
            f"sasl.mechanism.inter.broker.protocol={mech}",
            f"listener.name.sasl_plaintext.{mech.lower()}.sasl.jaas.config={scram} required "
            f'username="{user}" password="{password}";',
            "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
            "sasl.mechanism.controller.protocol=PLAIN",
            f"listener.name.controller.plain.sasl.jaas.config={plain} required "
            f'username="{user}" password="{password}" user_{user}="{password}";',
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found=false",
            f"super.users=User:{user}",
        ]

    def running(self) -> bool:
        return self.pidfile.alive_pid() is not None and port_open(self.port)

    def format_storage(self, cluster_id: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # Holds the admin password when SASL is on: private from its first byte.
        write_private(self.config_path, self.properties())
        (self.root / "log4j2.properties").write_text(LOG4J2)
        scram_marker = self.root / "scram.formatted"
        if (self.root / "data" / "meta.properties").exists():
            if self.settings.embedded_sasl and not scram_marker.exists():
                raise ServiceError(
                    f"the embedded Kafka in {self.root.parent} was created without "
                    "authentication, and clients now authenticate by default (SCRAM): stop "
                    f"the services and remove {self.root.parent} (its topics go with it), or "
                    "keep it unauthenticated with SETTLE_KAFKA_SECURITY_PROTOCOL=PLAINTEXT")
            return
        # The tool's arguments (the admin's SCRAM password among them) go through a private
        # java @argfile, so that no secret is on a command line anyone can read in ps.
        argfile = self.root / "format.args"
        write_private(argfile, "\n".join(f'"{a}"' for a in [
            # "=": a random base64 id may start with "-", which a separate argument
            # would turn into an unknown option.
            "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
            "-c", str(self.config_path), "--ignore-formatted", *self._scram_bootstrap()]))
        try:
            res = subprocess.run(
                [java_bin(), "-cp", kafka_classpath(self.settings),
                 f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
                 f"@{argfile}"],
                capture_output=True, text=True,
            )
        finally:
            argfile.unlink(missing_ok=True)
        if res.returncode != 0:
            raise ServiceError(
                f"formatting Kafka storage failed: {redact(res.stderr or res.stdout)}")
        if self.settings.embedded_sasl:  # its metadata holds the admin's SCRAM credentials
            scram_marker.touch()

    def _scram_bootstrap(self) -> list[str]:
        s = self.settings
        if not s.embedded_sasl:
            return []
        # Quoted in the argfile; embedded_sasl allows no quote, backslash or space in either
        # (a made password is hex).
        user, password = s.embedded_kafka_admin()
        return ["--add-scram", f"{s.kafka_sasl_mechanism}=[name={user},password={password}]"]

    def start(self) -> subprocess.Popen[bytes]:
        ensure_port_free(self.port, "SETTLE_KAFKA_PORT")
        ensure_port_free(self.controller_port, "SETTLE_KAFKA_CONTROLLER_PORT")
        heap = self.settings.kafka_heap
        argv = [
            java_bin(), "-Xms256m", f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
            "-cp", kafka_classpath(self.settings), "kafka.Kafka", str(self.config_path),
        ]
        return spawn(argv, self.log, self.pidfile, marker=str(self.config_path))

    def stop(self, kill: bool = False) -> bool:
        import signal

        return terminate(self.pidfile, timeout=30, sig=signal.SIGKILL if kill else signal.SIGTERM)


@dataclass(frozen=True)
class EmbeddedKafka:
    settings: Settings

    @property
    def root(self) -> Path:
        return self.settings.state_dir / "kafka"

    def recorded_size(self) -> int | None:
        f = self.root / "cluster.size"
        return int(f.read_text()) if f.exists() else None

    def nodes(self, size: int | None = None) -> list[KafkaNode]:
        n = size or self.recorded_size() or self.settings.kafka_brokers
        return [KafkaNode(self.settings, i, n) for i in range(1, n + 1)]

    def running_nodes(self) -> list[KafkaNode]:
        return [node for node in self.nodes() if node.running()]

    def start(self, brokers: int) -> str:
        recorded = self.recorded_size()
        if recorded is not None and recorded != brokers:
            if any(node.running() for node in self.nodes(recorded)):
                raise ServiceError(
                    f"a {recorded}-broker cluster is running; `settle services down` first to "
                    f"start {brokers} broker(s)"
                )
            # A different topology needs a fresh cluster: quorum membership is on disk.
            shutil.rmtree(self.root)
        nodes = self.nodes(brokers)
        if all(node.running() for node in nodes):
            return "already running"
        java_bin()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "cluster.size").write_text(str(brokers))
        id_file = self.root / "cluster.id"
        if not id_file.exists():
            id_file.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))
        cluster_id = id_file.read_text().strip()
        procs = {}
        for node in nodes:
            if not node.running():
                node.format_storage(cluster_id)
                procs[node.node_id] = node.start()
        try:
            for node in nodes:
                proc = procs.get(node.node_id)
                wait_until(
                    lambda node=node: port_open(node.port), 90, f"Kafka broker {node.node_id}",
                    node.log, alive=(lambda p=proc: p.poll() is None) if proc else None,
                )
        except ServiceError:
            for node in nodes:  # leave nothing half-started behind
                node.stop(kill=True)
            raise
        wait_until(lambda: self._brokers_registered(brokers), 90, "Kafka cluster",
                   nodes[0].log)
        return "started"

    def _brokers_registered(self, n: int) -> bool:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        try:
            md = AdminClient(
                {**self.settings.kafka_client_config(),
                 "bootstrap.servers": self.settings.bootstrap(n), "log_level": 0}
            ).list_topics(timeout=2)
        except KafkaException:  # not up yet: the caller polls again
            return False
        return len(md.brokers) >= n

    def stop(self) -> bool:
        # All nodes at once: each is a controller too, so stopping them one by one took the
        # quorum away from the last, whose shutdown then hung until SIGKILL (35.7 s for
        # three; together: 6.7 s, and every node writes its .kafka_cleanshutdown marker).
        return terminate_all([node.pidfile for node in self.nodes()], timeout=30)
