package deploy_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/yannh/kubeconform/pkg/resource"
	"github.com/yannh/kubeconform/pkg/validator"
)

// The Kubernetes JSON schemas the rendered chart is checked against, with
// no network: the kubeconform module (a test dependency, pinned in go.mod,
// in the module cache like any other) ships the definitions of every
// built-in kind (_definitions.json of yannh/kubernetes-json-schema, as of
// Kubernetes 1.33: resource.k8s.io/v1beta2 is there, PodSpec.hostnameOverride
// of 1.34 is not) as a fixture of its own tests. kubeSchemas makes
// kubeconform's strict layout out of it in a temporary directory: the
// definitions with additionalProperties: false on every object that lists
// its properties (as openapi2jsonschema --strict does, so a misspelt key
// fails), and one <kind>-<group>-<version>.json per kind referring to them.
const (
	schemaModule = "github.com/yannh/kubeconform"
	// schemaFixture is the definitions' file in the module; its hash pins
	// the version the tests were written against: a kubeconform upgrade
	// that changes it fails here first, to be looked at.
	schemaFixture = "fixtures/cache/6dc6142c64b944d783a3e783526114da8e747a14a11d8b32dd1f12e2d89a8330"
	schemaSHA256  = "de398e755b7113f9422571bc8923923fb78b580a0fa84f34383bf37abd3f6adf"
)

var (
	schemaOnce sync.Once
	schemaDir  string
	schemaErr  error
)

// kubeSchemas returns the directory of the strict schemas, made once per
// test binary (removed by TestMain's cleanup of the temporary directory).
func kubeSchemas(t *testing.T) string {
	t.Helper()
	schemaOnce.Do(func() { schemaDir, schemaErr = makeKubeSchemas() })
	require.NoError(t, schemaErr)
	return schemaDir
}

func makeKubeSchemas() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", schemaModule).Output()
	if err != nil {
		return "", fmt.Errorf("locating module %s (go mod download): %w", schemaModule, err)
	}
	src := filepath.Join(strings.TrimSpace(string(out)), schemaFixture)
	raw, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("reading the Kubernetes definitions: %w", err)
	}
	if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != schemaSHA256 {
		return "", fmt.Errorf("%s has sha256 %s, not the %s the tests were written against: check what changed (the Kubernetes version of the definitions) and update schemaSHA256", src, hex.EncodeToString(sum[:]), schemaSHA256)
	}
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("decoding %s: %w", src, err)
	}
	dir, err := os.MkdirTemp("", "bridge-kubeschemas-")
	if err != nil {
		return "", err
	}
	kinds := 0
	for name, def := range doc.Definitions {
		strictSchema(def)
		gvks, _ := def["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			// kubeconform's {{ .ResourceKind }}{{ .KindSuffix }}: kind, the
			// group's first label and the version, lower case.
			file := strings.ToLower(kind)
			if group != "" {
				file += "-" + strings.ToLower(strings.Split(group, ".")[0])
			}
			file += "-" + strings.ToLower(version) + ".json"
			wrapper := map[string]any{"$ref": "_definitions.json#/definitions/" + name}
			b, err := json.Marshal(wrapper)
			if err != nil {
				return "", err
			}
			if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
				return "", err
			}
			kinds++
		}
	}
	if kinds < 50 {
		return "", fmt.Errorf("%s: only %d kinds found: not the definitions expected", src, kinds)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "_definitions.json"), b, 0o644); err != nil {
		return "", err
	}
	kubeSchemaDirs = append(kubeSchemaDirs, dir)
	return dir, nil
}

// kubeSchemaDirs are removed by TestMain.
var kubeSchemaDirs []string

// strictSchema sets additionalProperties: false on every object schema of
// s that lists its properties and says nothing of others.
func strictSchema(s map[string]any) {
	if props, ok := s["properties"].(map[string]any); ok {
		if _, set := s["additionalProperties"]; !set {
			s["additionalProperties"] = false
		}
		for _, p := range props {
			if m, ok := p.(map[string]any); ok {
				strictSchema(m)
			}
		}
	}
	for _, k := range []string{"items", "additionalProperties"} {
		if m, ok := s[k].(map[string]any); ok {
			strictSchema(m)
		}
	}
	for _, k := range []string{"allOf", "anyOf", "oneOf"} {
		if l, ok := s[k].([]any); ok {
			for _, e := range l {
				if m, ok := e.(map[string]any); ok {
					strictSchema(m)
				}
			}
		}
	}
}

// kubeValidator checks manifests against the strict schemas. Kinds of
// CRDs (ServiceMonitor) have no schema here: skip lists them, and the
// caller checks them otherwise.
func kubeValidator(t *testing.T, skip ...string) validator.Validator {
	t.Helper()
	dir := kubeSchemas(t)
	sk := map[string]struct{}{}
	for _, k := range skip {
		sk[k] = struct{}{}
	}
	v, err := validator.New([]string{filepath.Join(dir, "{{ .ResourceKind }}{{ .KindSuffix }}.json")},
		validator.Opts{Strict: true, SkipKinds: sk, KubernetesVersion: "1.33.0"})
	require.NoError(t, err)
	return v
}

// requireKubeValid validates one manifest document and fails with
// kubeconform's errors, each at its path; a document of a kind the
// validator skips is reported as skipped.
func requireKubeValid(t *testing.T, v validator.Validator, name string, doc []byte) validator.Status {
	t.Helper()
	res := v.ValidateResource(resource.Resource{Path: name, Bytes: doc})
	if res.Status == validator.Valid || res.Status == validator.Skipped {
		return res.Status
	}
	var msgs bytes.Buffer
	for _, e := range res.ValidationErrors {
		fmt.Fprintf(&msgs, "\n  %s: %s", e.Path, e.Msg)
	}
	require.Failf(t, "not a valid Kubernetes object", "%s: %v%s\n---\n%s", name, res.Err, msgs.String(), doc)
	return res.Status
}

// TestKubeSchemasCatchMistakes shows that the schemas the chart is checked
// against refuse what a cluster would: an unknown key (a typo), a wrong
// type, a kind that has no schema.
func TestKubeSchemasCatchMistakes(t *testing.T) {
	t.Parallel()
	v := kubeValidator(t)
	good := `apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
        - name: x
          image: x
          readinessProbe: {httpGet: {path: /readyz, port: http}}
`
	res := v.ValidateResource(resource.Resource{Path: "good", Bytes: []byte(good)})
	require.Equal(t, validator.Valid, res.Status, "%v %v", res.Err, res.ValidationErrors)
	for name, bad := range map[string]string{
		"typo":         strings.Replace(good, "readinessProbe", "readinesProbe", 1),
		"nested typo":  strings.Replace(good, "httpGet: {path", "httpGet: {pth", 1),
		"wrong type":   strings.Replace(good, "spec:\n  selector", "spec:\n  replicas: two\n  selector", 1),
		"no such kind": strings.Replace(good, "kind: Deployment", "kind: Deploymnt", 1),
	} {
		res := v.ValidateResource(resource.Resource{Path: name, Bytes: []byte(bad)})
		require.NotEqual(t, validator.Valid, res.Status, "%s: accepted", name)
	}
}
