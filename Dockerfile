# Multi-stage build of both binaries into one small static image.
#   docker build -t stepcollect .
#   docker run stepcollect /api -h     (or /worker)
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/api ./cmd/api \
 && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/worker ./cmd/worker

# distroless/static: CA certificates (rediss://, https callbacks), tzdata, a
# non-root user, and nothing else.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/api /out/worker /
USER nonroot:nonroot
EXPOSE 9100 9101
ENTRYPOINT []
CMD ["/api"]
