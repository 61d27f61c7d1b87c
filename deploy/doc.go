// Package deploy holds kvroute's deployment files (kustomize bases and
// overlays under k8s/, the Grafana dashboard, and the top-level Dockerfile and
// docker-compose.yaml) and the tests that check them. It is its own Go module
// so that kustomize, k8s.io/api and the Gateway API and Istio types do not
// weigh on the router's module.
package deploy
