from . import grpc_predict_v2_pb2 as _grpc_predict_v2_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CallRequest(_message.Message):
    __slots__ = ("model_name", "model_version", "path", "method", "body", "metadata", "query")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_version: str
    path: str
    method: str
    body: bytes
    metadata: _containers.ScalarMap[str, str]
    query: str
    def __init__(self, model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., path: _Optional[str] = ..., method: _Optional[str] = ..., body: _Optional[bytes] = ..., metadata: _Optional[_Mapping[str, str]] = ..., query: _Optional[str] = ...) -> None: ...

class CallResponse(_message.Message):
    __slots__ = ("status_code", "content_type", "headers", "body")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    status_code: int
    content_type: str
    headers: _containers.ScalarMap[str, str]
    body: bytes
    def __init__(self, status_code: _Optional[int] = ..., content_type: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., body: _Optional[bytes] = ...) -> None: ...

class ModelFeedbackRequest(_message.Message):
    __slots__ = ("model_name", "model_version", "request", "response", "reward", "truth")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TRUTH_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_version: str
    request: _grpc_predict_v2_pb2.ModelInferRequest
    response: _grpc_predict_v2_pb2.ModelInferResponse
    reward: float
    truth: _grpc_predict_v2_pb2.ModelInferResponse
    def __init__(self, model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., request: _Optional[_Union[_grpc_predict_v2_pb2.ModelInferRequest, _Mapping]] = ..., response: _Optional[_Union[_grpc_predict_v2_pb2.ModelInferResponse, _Mapping]] = ..., reward: _Optional[float] = ..., truth: _Optional[_Union[_grpc_predict_v2_pb2.ModelInferResponse, _Mapping]] = ...) -> None: ...

class ModelFeedbackResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
