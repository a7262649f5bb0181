"""Writes grpc_service_pb2.py and grpc_service_pb2_grpc.py that work with
any grpcio and protobuf a machine happens to have.

The stubs protoc generates pin the versions that generated them: they refuse
to import under an older grpcio ("depends on grpcio>=…") or protobuf
(ValidateProtobufRuntimeVersion). The GPU machine's Python is not ours to
choose, so the GPU pack carries these instead: the same module names and the
attributes bench/python/server.py uses (every message class, the servicer
base, add_GRPCInferenceServiceServicer_to_server, the client stub), built at
import time from the serialized FileDescriptorSet through the descriptor-pool
and message-factory APIs every protobuf since 3.x has, and grpc's generic
handlers.

Usage: portable_stubs.py DESCRIPTOR_SET OUT_DIR
(DESCRIPTOR_SET from protoc --include_imports --descriptor_set_out).
"""

import base64
import os
import sys

PB2 = '''"""inference.GRPCInferenceService messages, built at import time from the
embedded FileDescriptorSet (bench/gpu/portable_stubs.py wrote this file)."""
import base64 as _base64

from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import message_factory as _message_factory

_SET = _base64.b64decode("{data}")
_pool = _descriptor_pool.DescriptorPool()
for _f in _descriptor_pb2.FileDescriptorSet.FromString(_SET).file:
    _pool.Add(_f)


def _message_class(desc):
    if hasattr(_message_factory, "GetMessageClass"):  # protobuf >= 4.21
        return _message_factory.GetMessageClass(desc)
    return _message_factory.MessageFactory(_pool).GetPrototype(desc)


DESCRIPTOR = _pool.FindFileByName("{file}")
for _name in DESCRIPTOR.message_types_by_name:
    globals()[_name] = _message_class(DESCRIPTOR.message_types_by_name[_name])
SERVICE = DESCRIPTOR.services_by_name["{service}"]
'''

PB2_GRPC = '''"""inference.GRPCInferenceService server and client, on grpc's generic
handlers (bench/gpu/portable_stubs.py wrote this file)."""
import grpc

import grpc_service_pb2 as _pb2

_SERVICE = _pb2.SERVICE


def _cls(desc):
    return _pb2._message_class(desc)


def _streaming(m):
    """(client streaming, server streaming) of method m."""
    return (getattr(m, "client_streaming", False), getattr(m, "server_streaming", False))


class GRPCInferenceServiceServicer(object):
    """Every method answers UNIMPLEMENTED until a subclass defines it."""


def _unimplemented(request, context):
    context.set_code(grpc.StatusCode.UNIMPLEMENTED)
    context.set_details("Method not implemented!")
    raise NotImplementedError("Method not implemented!")


def add_GRPCInferenceServiceServicer_to_server(servicer, server):
    handlers = {{}}
    for m in _SERVICE.methods:
        fn = getattr(servicer, m.name, None) or _unimplemented
        req, resp = _cls(m.input_type), _cls(m.output_type)
        make = {{
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }}[_streaming(m)]
        handlers[m.name] = make(fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE.full_name, handlers),))


class GRPCInferenceServiceStub(object):
    def __init__(self, channel):
        for m in _SERVICE.methods:
            req, resp = _cls(m.input_type), _cls(m.output_type)
            call = {{
                (False, False): channel.unary_unary,
                (False, True): channel.unary_stream,
                (True, False): channel.stream_unary,
                (True, True): channel.stream_stream,
            }}[_streaming(m)]
            setattr(self, m.name, call("/{{}}/{{}}".format(_SERVICE.full_name, m.name),
                                       request_serializer=req.SerializeToString,
                                       response_deserializer=resp.FromString))
'''


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-2])
    with open(argv[1], "rb") as f:
        data = base64.b64encode(f.read()).decode()
    os.makedirs(argv[2], exist_ok=True)
    with open(os.path.join(argv[2], "grpc_service_pb2.py"), "w") as f:
        f.write(PB2.format(data=data, file="grpc_service.proto", service="GRPCInferenceService"))
    with open(os.path.join(argv[2], "grpc_service_pb2_grpc.py"), "w") as f:
        f.write(PB2_GRPC.format())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
