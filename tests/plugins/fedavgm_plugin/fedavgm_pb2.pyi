from fedbayes.protos import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FedAvgMInstruction(_message.Message):
    __slots__ = ("weights", "training")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    weights: _common_pb2.TensorGroup
    training: _common_pb2.LocalTraining
    def __init__(self, weights: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., training: _Optional[_Union[_common_pb2.LocalTraining, _Mapping]] = ...) -> None: ...

class FedAvgMReply(_message.Message):
    __slots__ = ("delta",)
    DELTA_FIELD_NUMBER: _ClassVar[int]
    delta: _common_pb2.TensorGroup
    def __init__(self, delta: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ...) -> None: ...
