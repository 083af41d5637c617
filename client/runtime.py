"""What a client half of a strategy gets to work with: identity, data, model, device, durable state."""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import ERROR
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.common import log

from fedbayes.bayes.params import TensorLayout, buffer_layout, parameter_layout
from fedbayes.client.state import ClientState, ClientStateStore, StateLostError
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.tasks.compute import resolve_device
from fedbayes.tasks.config import ConfigError, DataSettings, RunSettings, round_seed
from fedbayes.tasks.datasets import Dataset, load_dataset
from fedbayes.tasks.models import build_run_model
from fedbayes.tasks.npzdata import load_data_path, load_npz_partition
from fedbayes.tasks.partitions import partition_dataset, read_split_file
from fedbayes.tasks.storage import is_safe_name

DEFAULT_STATE_DIR = Path(os.environ.get("FEDBAYES_STATE_DIR", Path.home() / ".fedbayes" / "state"))


@dataclass(frozen=True)
class NodeSettings:
    """A SuperNode's own settings (`--node-config`), fixed for the life of that client.

    client-id      stable identity, survives restarts (Flower's node id does not); default client-<partition-id>
    partition-id   which partition of the run's split this client holds (simulation fills it in)
    num-partitions how many partitions the split has
    data-path      a real deployment's own data: an .npz with `x` and `y` (tasks/npzdata.py)
    state-dir      root of the durable client state store
    device         auto | cpu | cuda; overrides the run config's `device`
    leave-and-forget  true: ask the server to forget this client instead of training, then leave (client/app.py;
                   `fedbayes client --leave --forget`); needs no data
    """

    client_id: str
    partition_id: int
    num_partitions: int
    data_path: str
    state_dir: str
    device: str
    leave_and_forget: bool = False

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any], default_device: str) -> NodeSettings:
        """Read a SuperNode's `--node-config`, the keys above.

        Args:
            node_config: the node's config, keys as above; missing ones take their defaults.
            default_device: the device when the node config names none (the run config's `device`).

        Returns:
            The settings.

        Raises:
            ConfigError: a client neither leaving nor with a `data-path` whose `partition-id` is not in
                [0, `num-partitions`), or a `client-id` that is not a safe name ([A-Za-z0-9._-]+).
            ValueError: `partition-id` or `num-partitions` is not an integer.
        """
        partition_id = int(node_config.get("partition-id", -1))
        num_partitions = int(node_config.get("num-partitions", 0))
        data_path = str(node_config.get("data-path", ""))
        leave_and_forget = node_config.get("leave-and-forget", False) is True
        if not leave_and_forget and not data_path and not 0 <= partition_id < num_partitions:
            raise ConfigError(
                f"node config needs 'data-path' or 0 <= 'partition-id' < 'num-partitions', "
                f"got partition-id={partition_id}, num-partitions={num_partitions}"
            )
        client_id = str(node_config.get("client-id", f"client-{partition_id}"))
        if not is_safe_name(client_id):
            raise ConfigError(f"node config 'client-id' must match [A-Za-z0-9._-]+, got {client_id!r}")
        return cls(
            client_id=client_id,
            partition_id=partition_id,
            num_partitions=num_partitions,
            data_path=data_path,
            state_dir=str(node_config.get("state-dir", DEFAULT_STATE_DIR)),
            device=str(node_config.get("device", default_device)),
            leave_and_forget=leave_and_forget,
        )


@dataclass
class ClientRuntime:
    settings: RunSettings
    node: NodeSettings
    data: Dataset
    model: torch.nn.Module
    layout: TensorLayout  # the model's parameters: what the strategy's math works on
    device: torch.device
    buffer_layout: TensorLayout = field(default_factory=dict)  # the rest of the model's state (client/core.py)
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds this message (client/app.py)

    @classmethod
    def create(cls, settings: RunSettings, node: NodeSettings) -> ClientRuntime:
        """Load this client's data and build the run's model for it.

        Args:
            settings: the run's settings.
            node: this SuperNode's settings.

        Returns:
            The runtime, its data scaled by the run's `input-scale`, on the node's device.

        Raises:
            ValueError: the data cannot be loaded or split (load_client_data), the model not built
                (build_run_model), or the device is unknown (resolve_device).
            DatasetNotFoundError: the dataset's files are missing.
            RuntimeError: "cuda" without a CUDA GPU.
        """
        data = load_client_data(settings.data, node).scaled(settings.input_scale)
        model = build_run_model(settings.architecture, data.input_shape, data.num_classes)
        return cls(
            settings=settings,
            node=node,
            data=data,
            model=model,
            layout=parameter_layout(model),
            device=resolve_device(node.device),
            buffer_layout=buffer_layout(model),
        )

    def state_store(self, federation: str) -> ClientStateStore:
        """This client's durable state in `federation`, under the node's `state-dir`.

        Args:
            federation: the federation's name, from the instruction's header.

        Returns:
            The store.

        Raises:
            ValueError: `federation` is not a safe directory name.
        """
        return ClientStateStore(self.node.state_dir, federation, self.node.client_id)

    def accepted_round(self, header: pb.Header) -> int:
        """The last round whose reply the server accepted from this client.

        Args:
            header: the instruction's header.

        Returns:
            The round; 0 when the server accepted none.
        """
        return header.accepted_rounds.get(self.node.client_id, 0)

    def load_state(self, header: pb.Header) -> ClientState | None:
        """The durable state this round starts from: the one after the last round the server accepted from
        this client (client/state.py), in the instruction's federation. None in the client's first round, and
        when that state is lost: the client then starts afresh and says so (resumed_from_round 0), and the
        server, whose record of this client no longer matches anything the client holds, follows it.

        Args:
            header: the instruction's header (its federation, round and accepted rounds).

        Returns:
            The state, or None as above. The time taken goes to `timings["state-load"]`.

        Raises:
            StateCorruptError: the state file exists but cannot be read.
        """
        started = time.perf_counter()
        try:
            return self.state_store(header.federation).load(self.accepted_round(header), header.server_round)
        except StateLostError as error:
            log(ERROR, "%s: %s; starting again from a fresh state", self.node.client_id, error)
            return None
        finally:
            self.timings["state-load"] = time.perf_counter() - started

    def save_state(self, header: pb.Header, state: ClientState) -> None:
        """Store the state after this round, keeping what the server may roll this client back to
        (ClientStateStore.save). The time taken goes to `timings["state-save"]`.

        Args:
            header: the instruction's header (its federation, round, accepted and checkpointed rounds).
            state: the state after this round.

        Raises:
            OSError: the state file cannot be written.
        """
        started = time.perf_counter()
        self.state_store(header.federation).save(
            state,
            header.server_round,
            self.accepted_round(header),
            header.checkpointed_rounds.get(self.node.client_id, 0),
        )
        self.timings["state-save"] = time.perf_counter() - started

    def local_seed(self, seed: int, server_round: int) -> int:
        """Per-client, per-round seed from the run seed the instruction carries; crc32 because str hashes differ
        between processes.

        Args:
            seed: the run seed.
            server_round: the round.

        Returns:
            round_seed(seed, server_round) XOR the crc32 of the client id.
        """
        return round_seed(seed, server_round) ^ zlib.crc32(self.node.client_id.encode())


def load_client_data(settings: DataSettings, node: NodeSettings) -> Dataset:
    """This client's examples, in the order its minibatch permutations index (run config `row-order`).

    Args:
        settings: the run's data settings.
        node: this SuperNode's settings: its `data-path`, else its partition of the run's split.

    Returns:
        The examples, unscaled; sorted by class with `row-order = "by-class"`.

    Raises:
        ValueError: the data is refused or cannot be split (NpzDataError, load_dataset, split_rows).
        DatasetNotFoundError: the dataset's files are missing.
    """
    data = _client_examples(settings, node)
    return data.by_class() if settings.row_order == "by-class" else data


def _client_examples(settings: DataSettings, node: NodeSettings) -> Dataset:
    if node.data_path:
        return load_data_path(Path(node.data_path), settings.dataset)  # x/y (or images/labels), uint8 -> [0, 1]
    prepartitioned = load_npz_partition(settings.dataset, node.partition_id, node.num_partitions)
    if prepartitioned is not None:  # npz:DIR with client-<i>.npz files: the split is the files'
        return prepartitioned
    full = load_dataset(settings.dataset, train=True, data_root=settings.data_root, download=settings.download)
    return full.subset(split_rows(settings, full.labels.numpy(), node.num_partitions)[node.partition_id])


def split_rows(settings: DataSettings, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Every client's rows of the training set (`labels`, all of it) under `settings`: the split file's, else the
    run seed's split.

    Args:
        settings: the run's data settings (split, seed, split file and their options).
        labels: every training example's label, shape (n,).
        num_clients: how many clients to split into, at least 1.

    Returns:
        One array of row indices into `labels` per client.

    Raises:
        ValueError: the split file is refused (read_split_file) or the split cannot be made (partition_dataset).
    """
    if settings.split_file:
        return read_split_file(settings.split_file, len(labels), num_clients, settings.split_file_overlap)
    return partition_dataset(
        labels, num_clients, settings.split, settings.seed, fraction=settings.fraction, **_split_options(settings)
    )


def _split_options(settings: DataSettings) -> dict[str, Any]:
    if settings.split == "dirichlet":
        return {
            "alpha_sizes": settings.dirichlet_alpha_sizes,
            "alpha_classes": settings.dirichlet_alpha_classes,
            "min_size": settings.min_client_size,
        }
    if settings.split == "two-class":
        return {"per_class": settings.two_class_per_class}
    return {}
