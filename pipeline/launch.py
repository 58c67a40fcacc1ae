"""`make distill NPROC=n [NNODES=m NODE_RANK=r MASTER_ADDR=host MASTER_PORT=port]`: one data-parallel job.

    python -m pipeline.launch --nproc N [--nnodes M --node-rank R --master-addr HOST --master-port P] -- CONFIG ...

checks the launch settings, prints the `accelerate launch` command and runs it on this node. ``--nproc`` is the
number of processes on THIS node (one per GPU; on a CPU, processes that share its cores through gloo); the job has
``nproc * nnodes`` processes. Every node runs the same command with its own ``--node-rank``; node 0 (at
``--master-addr``) hosts the rendezvous and is global rank 0, the one that writes every stage's output and the
MLflow runs, so the runs folder must be shared by all nodes.

The rendezvous is static (node ranks fixed by the caller, as Slurm's SLURM_NODEID and Kubeflow's PET_NODE_RANK
give them): a node that has not joined after 600 s (torch's static rendezvous timeout) fails the launch. Once
running, a collective that waits longer than $PIPELINE_DIST_TIMEOUT seconds (default 1800) fails the job
(docs/gpus-and-clusters.md#several-nodes).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import sys

DEFAULT_PORT = 29500


class LaunchError(Exception):
    pass


def _count(name: str, raw: str | int | None, lowest: int) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = None
    if value is None or value < lowest:
        raise LaunchError(f"{name}={raw!r} is not a whole number >= {lowest}.")
    return value


def names_this_machine(address: str) -> bool:
    """Whether ADDRESS is this machine by name, without asking DNS: localhost, a loopback address or this host's name
    (a one-node Slurm allocation or Kubernetes job exports MASTER_ADDR naming the node itself)."""
    address = address.strip().lower().rstrip(".")
    host = socket.gethostname().lower()
    return (
        address in ("localhost", "::1", host, host.split(".")[0])
        or address.startswith("127.")
        or (not address[:1].isdigit() and address.split(".")[0] == host.split(".")[0])
    )


def accelerate_command(nproc, nnodes, node_rank, master_addr, master_port, pipeline_args: list[str]) -> list[str]:
    """The `accelerate launch` argv for this node, after checking the settings (LaunchError says what is wrong)."""
    nproc, nnodes = _count("NPROC", nproc, 1), _count("NNODES", nnodes, 1)
    node_rank = _count("NODE_RANK", node_rank, 0)
    given_port = str(master_port or "").strip()
    port = _count("MASTER_PORT", given_port or DEFAULT_PORT, 1)
    if port > 65535:
        raise LaunchError(f"MASTER_PORT={master_port} is not a TCP port (1-65535).")
    master_addr = (master_addr or "").strip()
    if nnodes == 1 and (node_rank != 0 or (master_addr and not names_this_machine(master_addr))):
        given = [
            f"{name}={value}"
            for name, value, set_ in (
                ("NODE_RANK", node_rank, node_rank != 0),
                ("MASTER_ADDR", master_addr, bool(master_addr)),
            )
            if set_
        ]
        raise LaunchError(
            f"{' and '.join(given)} {'were' if len(given) > 1 else 'was'} given with NNODES=1 (the "
            "default: a job on this machine alone): a node rank other than 0 "
            "or the address of another node only mean something in a job over several nodes, and "
            "running alone would start a separate single-node job that never meets the other nodes. "
            "For a job over several nodes give NNODES=<nodes> on every node (the same on all); for a job "
            "on this machine alone leave NODE_RANK and MASTER_ADDR unset (unset MASTER_ADDR if your "
            "shell exports it)."
        )
    if node_rank >= nnodes:
        raise LaunchError(
            f"NODE_RANK={node_rank} is out of range for NNODES={nnodes}: node ranks are 0 to "
            f"{nnodes - 1}, one per node, and node 0 is the one at MASTER_ADDR."
        )
    if nnodes > 1 and not master_addr:
        raise LaunchError(
            f"NNODES={nnodes} needs MASTER_ADDR: the host name or IP address of node 0 (NODE_RANK=0), "
            "which every node can reach and where the rendezvous listens on MASTER_PORT."
        )
    if not pipeline_args:
        raise LaunchError("no pipeline arguments: give the config after --, e.g. -- tiny --runs-dir runs.")
    if nproc * nnodes == 1:  # one process (e.g. MASTER_ADDR naming this machine): a plain run, as `make distill`
        return [sys.executable, "-m", "pipeline", "run", *pipeline_args]
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    if not os.path.exists(accelerate):
        accelerate = shutil.which("accelerate") or accelerate
    # --multi_gpu on a CPU machine too: with --cpu, accelerate launch silently starts ONE process (DESIGN.md).
    command = [
        accelerate,
        "launch",
        "--multi_gpu",
        "--num_machines",
        str(nnodes),
        "--num_processes",
        str(nproc * nnodes),
    ]
    if nnodes > 1:
        command += [
            "--machine_rank",
            str(node_rank),
            "--main_process_ip",
            master_addr,
            "--main_process_port",
            str(port),
        ]
    elif given_port:  # one node: accelerate's own default port unless one was asked for
        command += ["--main_process_port", str(port)]
    return [*command, "-m", "pipeline", "run", *pipeline_args]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pipeline_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.launch",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nproc", default="1", help="processes on this node (default 1)")
    parser.add_argument("--nnodes", default="1", help="nodes in the job (default 1)")
    parser.add_argument("--node-rank", default="0", help="this node's rank, 0 to nnodes-1 (default 0)")
    parser.add_argument("--master-addr", default="", help="host or IP of node 0 (needed with --nnodes > 1)")
    parser.add_argument("--master-port", default="", help=f"rendezvous port on node 0 (default {DEFAULT_PORT})")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    args = parser.parse_args(own)
    try:
        command = accelerate_command(
            args.nproc, args.nnodes, args.node_rank, args.master_addr, args.master_port, pipeline_args
        )
    except LaunchError as exc:
        print(
            f"\nerror: {exc} Usage: make distill CONFIG=name NPROC=<processes per node> NNODES=<nodes> "
            "NODE_RANK=<0..NNODES-1> MASTER_ADDR=<node 0's address> MASTER_PORT=<port> (docs/gpus-and-clusters.md)."
            "\n",
            file=sys.stderr,
        )
        return 2
    print(f"launch: {shlex.join(command)}", file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    os.execv(command[0], command)  # this node's launcher replaces us: signals (Slurm, Kubernetes) reach it directly


if __name__ == "__main__":
    raise SystemExit(main())
