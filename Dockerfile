# kvroute's binaries (kvroute, kvsim, kvbridge, kvbench) in one small image.
#   docker build -t kvroute:dev .
#   docker run --rm kvroute:dev help
# The builder command is the one deploy/docker_test.go runs (it checks that
# every binary comes out statically linked), since no Docker engine runs in CI.

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so source edits do not refetch them.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
# Every command under cmd/ that exists, fully static: no cgo, no libc.
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -ldflags="-s -w" -o /out/ ./cmd/...

# distroless/static has CA certificates, /etc/passwd with nonroot (65532)
# and nothing else: no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
# 9002 ext_proc gRPC + gRPC health, 9090 /metrics /healthz /readyz,
# 18000 xDS (--xds-addr), 9091 kvbridge probes and metrics.
EXPOSE 9002 9090
ENTRYPOINT ["/usr/local/bin/kvroute"]
CMD ["serve"]
