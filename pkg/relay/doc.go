// Package relay is inplaced's CRI v1 pass-through: it forwards every call it
// receives to a backend CRI endpoint untouched, and decodes only the methods
// that have an interceptor registered.
//
// Server (router.go) serves the caller's connection at the HTTP/2 frame
// level: a stream no interceptor, open gate, stream filter or debug log wants
// is forwarded frame by frame to a backend HTTP/2 connection; every other one
// goes, the same way, to an in-process grpc.Server running the gRPC handler
// described below (Relay.ServerOptions).
//
// The gRPC handler:
//
//   - The server is created with grpc.UnknownServiceHandler and a codec that
//     passes frames through untouched (ForceServerCodecV2), so no CRI
//     service is registered: every method, including ones added to CRI after
//     this build, reaches Relay.handle. The proxy never answers Unimplemented
//     on its own — the backend does, if it must.
//   - Methods known to be unary (from the cri-api ServiceDescs) take a fast
//     path: one frame in, conn.Invoke, one frame out. A unary method with no
//     interceptor (and no debug log, which decodes IDs) is not even copied:
//     the request and answer stay in the buffers gRPC read them into until
//     gRPC writes them out again (passFrame, codecV2). Everything else
//     (GetContainerEvents, Stream* and unknown methods) is pumped as a
//     bidirectional stream, which is correct for every gRPC streaming shape.
//   - Metadata, deadlines and cancellation travel with the context; headers
//     and trailers are copied back; backend status errors are returned as
//     they are, so codes and messages reach the caller unchanged.
//   - An Interceptor registered for a method sees the raw request and a
//     `next` that forwards it. Unary adapts a typed function
//     (e.g. *runtimeapi.CreateContainerRequest) to that shape, so only
//     intercepted methods pay for decoding.
package relay
