// Package relay is inplaced's CRI v1 pass-through: it forwards every call it
// receives to a backend CRI endpoint untouched, and decodes only the methods
// that have an interceptor registered.
//
// Server (server.go) serves the caller's connection at the HTTP/2 frame
// level: a stream no interceptor, open gate, stream filter or debug log wants
// is forwarded frame by frame to a backend HTTP/2 connection; every other one
// goes, the same way, to an in-process grpc.Server running the gRPC handler
// described below (Relay.ServerOptions).
//
// The router, by file:
//
//   - server.go: Server, its listeners and sessions, the routes, the
//     in-process connections to the gRPC handler.
//   - session.go: one caller connection and the upstream connections it
//     opened, under one lock; one reader goroutine per connection, whose
//     loop is read a frame, handle it, then wait (pace.go) outside the lock.
//   - conn.go: a connection of a session (peer), opening an upstream one,
//     connection errors.
//   - frames.go: what each frame read does.
//   - request.go: the checks a request must pass, and the router's own
//     answers to one that is not a gRPC call.
//   - stream.go: a relayed stream, its state (streamState, halfState) and
//     every transition of it.
//   - flow.go: forwarding within the flow-control windows, what waits for
//     one, the credit given back.
//   - pace.go: pacing a caller that wastes our work, and the back-pressure
//     of a peer that does not read; limits.go: the limits that end a
//     connection.
//   - headers.go, hpackenc.go: header blocks decoded and encoded; rawio.go:
//     socket reads and writes that never wait under the lock (sockWriter).
//
// Server.Drain (drain.go) hands the callers over to the next process on the
// same socket at a restart: GOAWAY to each, the calls in flight let finish
// within the grace, the connections made meanwhile held and then sent on.
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
//
// # Threat model
//
// Who reaches the relay: whoever can connect to inplaced's CRI socket
// (root, or the socket's group: kubelet, crictl, node agents). Such a caller
// can already make containerd run anything, so the relay does not defend
// containerd's contents from it; it defends availability — inplaced's own
// memory and CPU, containerd's, and the other callers' calls (kubelet's
// above all) — against a caller that is buggy or hostile at the HTTP/2
// level. The backends are containerd or CRI-O, trusted, but a backend that
// stalls must not stall what does not depend on it.
//
// What a caller can make inplaced and the backend do, and the bound:
//
//   - Open streams: at most maxStreams at once (SETTINGS_MAX_CONCURRENT_STREAMS,
//     enforced with REFUSED_STREAM); each goes to the backend, within the
//     backend's own MAX_CONCURRENT_STREAMS (streams beyond it wait, as in
//     grpc-go's client, and are never sent over it).
//   - Open and reset streams in a loop (CVE-2023-44487): every reset of a
//     stream the backend had not answered, and every refused stream, counts;
//     every answered call takes one off; past rapidResetLimit the connection
//     ends (GOAWAY ENHANCE_YOUR_CALM). The backend sees at most that many
//     cancelled calls more than answered ones per connection, and none for
//     a stream whose RST_STREAM came right behind its HEADERS
//     (session.resetNext). An attacker that reconnects at once is bounded
//     per connection only: connections cost it a handshake each.
//   - Before those limits end a connection, its flood is paced: past
//     paceFree wasted resets or control frames, the caller's reader pauses
//     pacePause after every paceEvery more, so that a flood cannot take
//     every CPU from the other callers.
//   - Make us acknowledge: more than maxControlFrames PING or SETTINGS frames
//     between two HEADERS or DATA frames we send it end the connection; so
//     do more than maxQueuedControlFrames acknowledgements waiting for a
//     caller that does not read them.
//   - Header blocks: at most maxHeaderList decoded bytes (x/net's checks)
//     and maxHeaderFrames frames per block (CONTINUATION floods).
//   - Memory: data waits in the router only within the windows it granted
//     (16 MiB a stream, 32 MiB a connection); a request that is not gRPC is
//     answered by the router and reaches no backend.
//   - Stop reading: writes never wait under the session's lock (sockWriter);
//     what a peer does not take waits in its overflow up to maxOverflow,
//     then the session stops reading until it drains or the write deadline
//     (30 s) ends the connection. Other sessions are never affected: each
//     caller connection has its own state, lock and backend connections.
//
// With WithGRPCServer (config relay: grpc) the callers' connections are
// grpc-go's server's own, with grpc-go's limits and checks and nothing in
// front of them: the fallback is plain grpc-go, so that it does not share a
// bug of the router's. It advertises the same stream limit (maxStreams,
// grpc.MaxConcurrentStreams), which grpc-go enforces with REFUSED_STREAM
// and which also bounds its running handlers (grpc-go's own answer to
// CVE-2023-44487). A malformed request grpc-go accepts (a `te` other than
// "trailers", no :scheme, a stream that depends on itself, a body that
// disagrees with its content-length) reaches the backend as the call it
// names, as it would going to containerd directly (TestMalformedRequests;
// docs/architecture.md).
//
// Each limit that ends a connection is logged (warn) and counted by the
// abuse observer (the metric inplaced_relay_abuse_total{limit}). Protocol
// errors end the connection with the HTTP/2 error code (GOAWAY) or, where
// RFC 9113 makes them stream errors, the stream (RST_STREAM).
package relay
