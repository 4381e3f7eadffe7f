package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/yannh/kubeconform/pkg/validator"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/testpki"
)

// chartDir is the Helm chart, relative to this package's directory.
const chartDir = "helm/bridge"

// helmKubeVersion is the Kubernetes version the chart is rendered for: the
// version of the schemas it is checked against (kubeschema_test.go).
var helmKubeVersion = &chartutil.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"}

const (
	helmRelease   = "cdc"
	helmNamespace = "data"
)

// renderChart renders the chart as `helm install --dry-run` (client only)
// would with vals over values.yaml: the manifests by template file, and
// NOTES.txt.
func renderChart(t *testing.T, vals map[string]any) (map[string]string, string, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	require.NoError(t, err)
	inst := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	inst.DryRun, inst.ClientOnly, inst.Replace = true, true, true
	inst.ReleaseName, inst.Namespace = helmRelease, helmNamespace
	inst.KubeVersion = helmKubeVersion
	rel, err := inst.Run(ch, copyValues(t, vals))
	if err != nil {
		return nil, "", err
	}
	return releaseutil.SplitManifests(rel.Manifest), rel.Info.Notes, nil
}

// copyValues deep-copies vals (Helm merges into the map it is given).
func copyValues(t *testing.T, vals map[string]any) map[string]any {
	t.Helper()
	b, err := sigsyaml.Marshal(vals)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, sigsyaml.Unmarshal(b, &out))
	if out == nil {
		out = map[string]any{}
	}
	return out
}

// lintChart runs helm lint with vals and fails on any warning or error.
func lintChart(t *testing.T, vals map[string]any) {
	t.Helper()
	l := lint.AllWithKubeVersion(chartDir, copyValues(t, vals), helmNamespace, helmKubeVersion)
	for _, m := range l.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		}
	}
}

// chartValues parses YAML values, as a -f file would give them.
func chartValues(t *testing.T, y string) map[string]any {
	t.Helper()
	var out map[string]any
	require.NoError(t, sigsyaml.Unmarshal([]byte(y), &out))
	return out
}

// rendered is a rendered chart, decoded into the API's own types with
// unknown fields refused.
type rendered struct {
	docs         map[string][]byte // by "<Kind>/<name>"
	bridge       *appsv1.Deployment
	serve        *appsv1.Deployment
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	services     map[string]*corev1.Service
	pdb          *policyv1.PodDisruptionBudget
	sa           *corev1.ServiceAccount
	monitor      *helmServiceMonitor
	notes        string
	fullname     string
	serveName    string
	bridgeConfig string // the bridge.yaml the pods mount
}

// helmServiceMonitor is the part of the Prometheus Operator's
// ServiceMonitor the chart writes; decoded strictly (no schema for CRDs).
type helmServiceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		JobLabel string `json:"jobLabel"`
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port      string `json:"port"`
			Path      string `json:"path"`
			Interval  string `json:"interval"`
			Scheme    string `json:"scheme"`
			TLSConfig *struct {
				CA struct {
					Secret corev1.SecretKeySelector `json:"secret"`
				} `json:"ca"`
				ServerName string `json:"serverName"`
			} `json:"tlsConfig"`
			Authorization *struct {
				Type        string                   `json:"type"`
				Credentials corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// decodeRendered validates every document against the Kubernetes schemas
// and decodes it.
func decodeRendered(t *testing.T, files map[string]string, notes string, existingConfig string) *rendered {
	t.Helper()
	v := kubeValidator(t, "ServiceMonitor")
	r := &rendered{docs: map[string][]byte{}, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		services: map[string]*corev1.Service{}, notes: notes, fullname: helmRelease + "-bridge", serveName: helmRelease + "-bridge-serve"}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		doc := []byte(files[n])
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		require.NoError(t, sigsyaml.Unmarshal(doc, &head), n)
		if head.Kind == "" {
			continue // an empty document
		}
		key := head.Kind + "/" + head.Metadata.Name
		require.NotContains(t, r.docs, key, "rendered twice")
		r.docs[key] = doc
		assert.Equal(t, helmNamespace, head.Metadata.Namespace, "%s: the release's namespace", key)
		want := validator.Valid
		if head.Kind == "ServiceMonitor" {
			want = validator.Skipped // a CRD: decoded strictly below
		}
		require.Equal(t, want, requireKubeValid(t, v, key, doc), key)
		if os.Getenv("BRIDGE_HELM_DUMP") != "" {
			t.Logf("%s:\n%s", key, doc)
		}
		strict := func(out any) {
			t.Helper()
			require.NoError(t, sigsyaml.UnmarshalStrict(doc, out), "%s: a key the API does not know", key)
		}
		switch head.Kind {
		case "Deployment":
			d := &appsv1.Deployment{}
			strict(d)
			switch d.Name {
			case r.fullname:
				r.bridge = d
			case r.serveName:
				r.serve = d
			default:
				t.Fatalf("unexpected Deployment %s", d.Name)
			}
		case "ConfigMap":
			c := &corev1.ConfigMap{}
			strict(c)
			r.configMaps[c.Name] = c
		case "Secret":
			s := &corev1.Secret{}
			strict(s)
			r.secrets[s.Name] = s
		case "Service":
			s := &corev1.Service{}
			strict(s)
			r.services[s.Name] = s
		case "PodDisruptionBudget":
			r.pdb = &policyv1.PodDisruptionBudget{}
			strict(r.pdb)
		case "ServiceAccount":
			r.sa = &corev1.ServiceAccount{}
			strict(r.sa)
		case "ServiceMonitor":
			r.monitor = &helmServiceMonitor{}
			strict(r.monitor)
			require.Equal(t, "monitoring.coreos.com/v1", r.monitor.APIVersion)
		default:
			t.Fatalf("%s: a kind the test does not check", key)
		}
	}
	require.NotNil(t, r.bridge, "no bridge Deployment")
	cmName := volumeByName(t, r.bridge, "config").ConfigMap.Name
	if existingConfig != "" {
		require.Empty(t, r.configMaps, "config.existingConfigMap: the chart renders no ConfigMap")
		r.bridgeConfig = existingConfig
	} else {
		cm, ok := r.configMaps[cmName]
		require.True(t, ok, "the Deployment mounts ConfigMap %s, which the chart does not render", cmName)
		r.bridgeConfig = cm.Data["bridge.yaml"]
	}
	return r
}

func volumeByName(t *testing.T, d *appsv1.Deployment, name string) corev1.Volume {
	t.Helper()
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	require.Failf(t, "no such volume", "%s has no volume %s", d.Name, name)
	return corev1.Volume{}
}

// secretStore is what the cluster holds besides the chart: the Secrets
// and ConfigMaps the values name, by name and key, with real credentials
// (a creds file, an nkey seed, certificates) made for the test.
type secretStore struct {
	secrets    map[string]map[string]string
	configMaps map[string]map[string]string
}

func newSecretStore(t *testing.T) *secretStore {
	t.Helper()
	ca := testpki.NewCA(t, "cluster CA")
	tlsSecret := func(cn string, client bool) map[string]string {
		crt, key := ca.Issue(t, testpki.Leaf{CommonName: cn, DNS: []string{cn}, Client: client})
		return map[string]string{"ca.crt": string(ca.PEM), "tls.crt": string(crt), "tls.key": string(key)}
	}
	// A .creds file as nsc makes it: a user JWT signed by its account, and
	// the user's seed.
	acct, err := nkeys.CreateAccount()
	require.NoError(t, err)
	user, err := nkeys.CreateUser()
	require.NoError(t, err)
	upub, err := user.PublicKey()
	require.NoError(t, err)
	useed, err := user.Seed()
	require.NoError(t, err)
	uc := natsjwt.NewUserClaims(upub)
	uc.Expires = time.Now().Add(24 * time.Hour).Unix()
	ujwt, err := uc.Encode(acct)
	require.NoError(t, err)
	creds, err := natsjwt.FormatUserConfig(ujwt, useed)
	require.NoError(t, err)
	jwks := testpki.JWKS(t, testpki.JWK{Kid: "k1", Alg: "ES256", Key: testpki.ECKey(t).Public()})
	main := map[string]string{
		"pg-dsn":           "postgres://bridge:pg-s3cret-value@db.example.internal:5432/shop?sslmode=require",
		"nats.creds":       string(creds),
		"nats.nk":          string(useed),
		"nats-user":        "bridge",
		"nats-password":    "nats-s3cret-value",
		"nats-token":       "nats-t0ken-value",
		"http-token":       "http-t0ken-value-for-prometheus",
		"jwt-hs256-secret": "0123456789abcdef0123456789abcdef-hs256-secret",
	}
	return &secretStore{
		secrets: map[string]map[string]string{
			helmRelease + "-bridge": main,
			"bridge-existing":       main,
			"nats-client-tls":       tlsSecret("nats.nats.svc", true),
			"bridge-http-tls":       tlsSecret(helmRelease+"-bridge."+helmNamespace+".svc", false),
			"bridge-feeds-tls":      tlsSecret("feeds.example.com", false),
			"pg-client-tls":         tlsSecret("bridge", true),
		},
		configMaps: map[string]map[string]string{"bridge-jwks": {"jwks.json": string(jwks)}},
	}
}

// podConfig loads the bridge.yaml a container of d would read, with the
// environment it sets (secretKeyRefs resolved from the Secrets, those the
// chart renders first) and the files it mounts written under a temporary
// root, the paths in the environment moved there: what `bridge run` or
// `bridge serve` in that pod would check at start, through config.Load and
// app.New (every plugin block, serve.auth, TLS files, NATS credentials).
func podConfig(t *testing.T, r *rendered, st *secretStore, d *appsv1.Deployment, opts ...app.Option) *config.Config {
	t.Helper()
	require.Len(t, d.Spec.Template.Spec.Containers, 1)
	c := d.Spec.Template.Spec.Containers[0]
	secretData := func(name string) map[string]string {
		if s, ok := r.secrets[name]; ok {
			return s.StringData
		}
		s, ok := st.secrets[name]
		require.True(t, ok, "%s refers to Secret %s, which neither the chart nor the test's cluster has", d.Name, name)
		return s
	}
	root := t.TempDir()
	vols := map[string]corev1.Volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	var mounts []string
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		require.True(t, ok, "%s mounts volume %s, which the pod does not have", d.Name, m.Name)
		var data map[string]string
		var items []corev1.KeyToPath
		switch {
		case v.Secret != nil:
			data, items = secretData(v.Secret.SecretName), v.Secret.Items
			require.True(t, m.ReadOnly, "%s: Secret %s mounted writable", d.Name, m.Name)
		case v.ConfigMap != nil:
			if v.Name == "config" {
				data = map[string]string{"bridge.yaml": r.bridgeConfig}
			} else {
				var ok bool
				data, ok = st.configMaps[v.ConfigMap.Name]
				require.True(t, ok, "no ConfigMap %s", v.ConfigMap.Name)
			}
			items = v.ConfigMap.Items
		default:
			continue
		}
		mounts = append(mounts, m.MountPath)
		dir := filepath.Join(root, m.MountPath)
		require.NoError(t, os.MkdirAll(dir, 0o700))
		if len(items) == 0 { // every key, as a file
			for k := range data {
				items = append(items, corev1.KeyToPath{Key: k, Path: k})
			}
		}
		for _, it := range items {
			val, ok := data[it.Key]
			require.True(t, ok, "%s: volume %s projects key %q, which its Secret or ConfigMap does not hold", d.Name, m.Name, it.Key)
			require.NoError(t, os.WriteFile(filepath.Join(dir, it.Path), []byte(val), 0o600))
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		val := e.Value
		if e.ValueFrom != nil {
			ref := e.ValueFrom.SecretKeyRef
			require.NotNil(t, ref, "%s: %s: only secretKeyRef is expected", d.Name, e.Name)
			var ok bool
			val, ok = secretData(ref.Name)[ref.Key]
			require.True(t, ok, "%s: %s takes key %q of Secret %s, which it does not hold", d.Name, e.Name, ref.Key, ref.Name)
		}
		for _, m := range mounts {
			val = strings.ReplaceAll(val, m+"/", filepath.Join(root, m)+"/")
		}
		env[e.Name] = val
	}
	require.GreaterOrEqual(t, len(c.Args), 3)
	require.Equal(t, "-c", c.Args[1], "%s: args %q", d.Name, c.Args)
	cfgPath := filepath.Join(root, c.Args[2])
	require.FileExists(t, cfgPath, "%s: the config file it reads is mounted", d.Name)
	var list []string
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	cfg, err := config.Load(cfgPath, config.WithEnv(func() []string { return list }))
	require.NoError(t, err, "%s: config.Load", d.Name)
	_, err = app.New(cfg, opts...)
	require.NoError(t, err, "%s: app.New", d.Name)
	return cfg
}

// containerPort returns the port named name of c.
func containerPort(t *testing.T, c corev1.Container, name string) int {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return int(p.ContainerPort)
		}
	}
	require.Failf(t, "no such port", "%s has no port %s", c.Name, name)
	return 0
}

// selects reports whether every label of sel is in labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// requireHardenedPod checks what the restricted Pod Security Standard and
// the bridge's own rules ask of a pod: non-root, read-only root file
// system, no privilege escalation or capabilities, RuntimeDefault seccomp,
// no service account token, requests and a memory limit, probes on the
// health endpoints at the listener's port.
func requireHardenedPod(t *testing.T, d *appsv1.Deployment, portName string, listen string, tls bool) {
	t.Helper()
	ps := d.Spec.Template.Spec
	require.NotNil(t, ps.SecurityContext)
	assert.True(t, ps.SecurityContext.RunAsNonRoot != nil && *ps.SecurityContext.RunAsNonRoot, "%s: runAsNonRoot", d.Name)
	assert.True(t, ps.SecurityContext.RunAsUser != nil && *ps.SecurityContext.RunAsUser != 0, "%s: runAsUser not root", d.Name)
	require.NotNil(t, ps.SecurityContext.SeccompProfile, "%s: seccompProfile", d.Name)
	assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, ps.SecurityContext.SeccompProfile.Type)
	assert.False(t, ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken, "%s: no service account token", d.Name)
	assert.False(t, ps.EnableServiceLinks == nil || *ps.EnableServiceLinks, "%s: enableServiceLinks false", d.Name)
	assert.False(t, ps.HostNetwork || ps.HostPID || ps.HostIPC, "%s: host namespaces", d.Name)
	c := ps.Containers[0]
	sc := c.SecurityContext
	require.NotNil(t, sc, "%s: container securityContext", d.Name)
	assert.True(t, sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem, "%s: readOnlyRootFilesystem", d.Name)
	assert.True(t, sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation, "%s: allowPrivilegeEscalation false", d.Name)
	require.NotNil(t, sc.Capabilities, "%s: capabilities", d.Name)
	assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, "%s: drop ALL", d.Name)
	assert.Empty(t, sc.Capabilities.Add)
	assert.False(t, sc.Privileged != nil && *sc.Privileged)
	assert.False(t, c.Resources.Requests.Cpu().IsZero(), "%s: a cpu request", d.Name)
	assert.False(t, c.Resources.Requests.Memory().IsZero(), "%s: a memory request", d.Name)
	assert.False(t, c.Resources.Limits.Memory().IsZero(), "%s: a memory limit", d.Name)
	// /tmp is writable (spill files) though the root is not.
	tmp := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/tmp" && volumeByName(t, d, m.Name).EmptyDir != nil {
			tmp = true
		}
	}
	assert.True(t, tmp, "%s: /tmp is an emptyDir", d.Name)
	port := containerPort(t, c, portName)
	require.Equal(t, port, listenPort(t, listen), "%s: the container port is the listen address's", d.Name)
	scheme := corev1.URISchemeHTTP
	if tls {
		scheme = corev1.URISchemeHTTPS
	}
	for path, p := range map[string]*corev1.Probe{"/livez": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		require.NotNil(t, p, "%s: probe %s", d.Name, path)
		require.NotNil(t, p.HTTPGet, "%s: probe %s is httpGet", d.Name, path)
		assert.Equal(t, path, p.HTTPGet.Path)
		assert.Equal(t, intstr.FromString(portName), p.HTTPGet.Port)
		assert.Equal(t, scheme, p.HTTPGet.Scheme, "%s: probe %s scheme", d.Name, path)
	}
}

// helmCase is a value set and what it must render.
type helmCase struct {
	name   string
	values string
	// existingConfig is the bridge.yaml of config.existingConfigMap.
	existingConfig string
	check          func(t *testing.T, r *rendered, run, serve *config.Config)
}

func TestHelmChart(t *testing.T) {
	t.Parallel()
	st := newSecretStore(t)
	cases := []helmCase{
		{name: "defaults", check: func(t *testing.T, r *rendered, run, serve *config.Config) {
			// Nothing but health and metrics (no rows) beyond loopback.
			assert.False(t, run.HTTP.Console, "the web console is off by default")
			assert.Nil(t, r.serve, "no feeds by default")
			assert.Equal(t, config.AuthNone, run.Serve.EffectiveMode())
			assert.True(t, run.HTTP.AllowPublic, "/metrics open (no rows), as in deploy/k8s")
			assert.Equal(t, "/run/secrets/bridge/nats/user.creds", envValue(t, r.bridge, "BRIDGE_NATS__CREDS"), "NATS with a creds file by default")
			assert.Empty(t, r.secrets, "the chart makes no Secret by default: you create it")
			assert.Equal(t, int32(1), *r.bridge.Spec.Replicas)
			assert.Equal(t, appsv1.RecreateDeploymentStrategyType, r.bridge.Spec.Strategy.Type)
			assert.Contains(t, r.notes, "kubectl -n "+helmNamespace+" create secret generic "+r.fullname)
			assert.Nil(t, r.monitor)
		}},
		{name: "auth and TLS", values: `
secret: {name: bridge-existing}
nats:
  auth: {type: nkey}
  tls: {enabled: true, secretName: nats-client-tls, serverName: nats.nats.svc}
postgres:
  tls: {secretName: pg-client-tls}
http:
  token: {enabled: true}
  tls: {enabled: true, secretName: bridge-http-tls}
  console: {enabled: true}
  allowedHosts: [bridge.example.com]
serve:
  enabled: true
  tls: {enabled: true, secretName: bridge-feeds-tls}
  allowedHosts: [feeds.example.com]
auth:
  jwt:
    jwksConfigMap: bridge-jwks
    issuer: https://login.example.com/
    audience: bridge-feeds
    tablesClaim: feeds_tables
    where: {eq: [tenant_id, "{{.claims.tenant_id}}"]}
serviceMonitor: {enabled: true, labels: {release: prometheus}}
`, check: func(t *testing.T, r *rendered, run, serve *config.Config) {
			assert.True(t, run.HTTP.Console)
			assert.Empty(t, app.ConsoleOff(run), "the console is served: behind JWTs")
			assert.Equal(t, config.AuthJWT, run.Serve.EffectiveMode())
			assert.True(t, run.HTTP.TLS.Enabled())
			assert.False(t, run.HTTP.AllowPublic)
			assert.NotEmpty(t, run.HTTP.Token)
			assert.Equal(t, []string{"bridge.example.com"}, run.HTTP.AllowedHosts)
			assert.NotEmpty(t, run.NATS.NKeySeedFile)
			assert.True(t, run.NATS.TLS.Enabled())
			assert.NotEmpty(t, run.NATS.TLS.CertFile, "mutual TLS to NATS")
			require.NotNil(t, r.serve)
			assert.Equal(t, config.AuthJWT, serve.Serve.EffectiveMode())
			assert.True(t, serve.Serve.TLS.Enabled())
			assert.Equal(t, "feeds_tables", serve.Serve.Auth.TablesClaim)
			assert.NotEmpty(t, serve.Serve.Auth.Where)
			assert.Equal(t, []string{"feeds.example.com"}, serve.Serve.AllowedHosts)
			assert.Empty(t, serve.HTTP.Listen, "bridge serve's pod serves no bridge run listener")
			// Annotation-based scraping would skip the token: none.
			assert.NotContains(t, r.bridge.Spec.Template.Annotations, "prometheus.io/scrape")
			require.NotNil(t, r.monitor)
			ep := r.monitor.Spec.Endpoints[0]
			assert.Equal(t, "https", ep.Scheme)
			require.NotNil(t, ep.Authorization, "the ServiceMonitor sends http.token")
			assert.Equal(t, "bridge-existing", ep.Authorization.Credentials.Name)
			assert.Equal(t, "http-token", ep.Authorization.Credentials.Key)
			require.NotNil(t, ep.TLSConfig)
			assert.Equal(t, "bridge-http-tls", ep.TLSConfig.CA.Secret.Name)
			assert.Equal(t, "prometheus", r.monitor.Metadata.Labels["release"])
		}},
		{name: "hs256 feeds behind a TLS-terminating mesh", values: `
secret:
  create: true
  stringData:
    pg-dsn: postgres://bridge:pw@db:5432/shop?sslmode=verify-full&sslrootcert=/run/secrets/bridge/pg-tls/ca.crt
    nats-user: bridge
    nats-password: a-password
    jwt-hs256-secret: 0123456789abcdef0123456789abcdef0123
postgres:
  tls: {secretName: pg-client-tls}
nats:
  auth: {type: userPassword}
serve: {enabled: true, allowPlaintext: true, replicaCount: 3}
auth:
  jwt: {hs256SecretKey: jwt-hs256-secret, tablesClaim: tables}
`, check: func(t *testing.T, r *rendered, run, serve *config.Config) {
			require.Contains(t, r.secrets, r.fullname, "secret.create renders the Secret")
			assert.Equal(t, "bridge", run.NATS.User)
			assert.Equal(t, "a-password", run.NATS.Password)
			assert.False(t, run.HTTP.Console, "feeds on, the console still off")
			assert.Equal(t, config.AuthJWT, serve.Serve.EffectiveMode())
			assert.Len(t, serve.Serve.Auth.HS256Secret, 36)
			assert.Equal(t, int32(3), *r.serve.Spec.Replicas)
			assert.Contains(t, run.Sources["shop"].Config["dsn"], "/run/secrets/bridge/pg-tls/ca.crt", "the DSN's sslrootcert is mounted")
		}},
		{name: "fleet", values: `
replicaCount: 3
fleet: {enabled: true, lease: 10s}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector: {matchLabels: {app.kubernetes.io/name: bridge}}
`, check: func(t *testing.T, r *rendered, run, serve *config.Config) {
			assert.Equal(t, int32(3), *r.bridge.Spec.Replicas)
			assert.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, r.bridge.Spec.Strategy.Type)
			assert.Equal(t, []string{"run", "-c", "/etc/bridge/bridge.yaml", "--fleet", r.fullname, "--fleet-lease", "10s"}, r.bridge.Spec.Template.Spec.Containers[0].Args)
			require.NotNil(t, r.pdb)
			assert.Equal(t, intstr.FromInt32(1), *r.pdb.Spec.MaxUnavailable)
		}},
		{name: "existing ConfigMap and Secret", values: `
config: {existingConfigMap: my-bridge-config}
secret: {name: bridge-existing}
postgres:
  dsn:
    shop: null        # Helm merges maps: the default source's entry goes
    orders-eu: {key: pg-dsn}
nats:
  auth: {type: token}
`, existingConfig: `
name: orders
nats: {url: "tls://nats.example.internal:4222"}
sources:
  orders-eu: {type: pgoutput, config: {slot: bridge_orders, publication: bridge_orders}}
sinks:
  main: {type: nats_jetstream, config: {stream: ORDERS, subjects: ["orders.>"]}}
routes:
  - sinks: [main]
    subject: "orders.{{.Table}}"
http: {listen: 127.0.0.1:9999, console: true, allow_public: false}
`, check: func(t *testing.T, r *rendered, run, serve *config.Config) {
			assert.Equal(t, "my-bridge-config", volumeByName(t, r.bridge, "config").ConfigMap.Name)
			assert.Equal(t, "orders", run.Name)
			assert.Equal(t, "nats-t0ken-value", run.NATS.Token)
			// The file's own http section loses to the chart's variables.
			assert.Equal(t, "0.0.0.0:8080", run.HTTP.Listen)
			assert.False(t, run.HTTP.Console)
			for _, e := range r.bridge.Spec.Template.Spec.Containers[0].Env {
				if e.ValueFrom != nil {
					assert.Equal(t, "bridge-existing", e.ValueFrom.SecretKeyRef.Name, e.Name)
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			vals := chartValues(t, tc.values)
			lintChart(t, vals)
			files, notes, err := renderChart(t, vals)
			require.NoError(t, err)
			r := decodeRendered(t, files, notes, tc.existingConfig)
			checkRendered(t, r)
			var opts []app.Option
			if args := r.bridge.Spec.Template.Spec.Containers[0].Args; len(args) > 4 && args[3] == "--fleet" {
				opts = append(opts, app.WithFleet(args[4], 10*time.Second))
			}
			run := podConfig(t, r, st, r.bridge, opts...)
			requireHardenedPod(t, r.bridge, "http", run.HTTP.Listen, run.HTTP.TLS.Enabled())
			requireDoorsClosed(t, run, "bridge run")
			ps := r.bridge.Spec.Template.Spec
			grace := time.Duration(*ps.TerminationGracePeriodSeconds) * time.Second
			assert.Greater(t, grace, time.Duration(goodbyes(run))*run.Shutdown.Timeout, "the grace period covers a clean stop's goodbyes")
			var serve *config.Config
			if r.serve != nil {
				serve = podConfig(t, r, st, r.serve)
				requireHardenedPod(t, r.serve, "feeds", serve.Serve.Listen, serve.Serve.TLS.Enabled())
				requireDoorsClosed(t, serve, "bridge serve")
				assert.Equal(t, config.AuthJWT, serve.Serve.EffectiveMode(), "feeds beyond loopback only with JWTs")
				// The pod the feeds' clients reach never connects to
				// Postgres: it holds no DSN with credentials, no client
				// certificate.
				for _, e := range r.serve.Spec.Template.Spec.Containers[0].Env {
					if strings.HasPrefix(e.Name, "BRIDGE_SOURCES__") {
						assert.Nil(t, e.ValueFrom, "%s: bridge serve takes %s from a Secret", r.serve.Name, e.Name)
					}
				}
				for _, v := range r.serve.Spec.Template.Spec.Volumes {
					assert.NotEqual(t, "pg-tls", v.Name, "bridge serve mounts Postgres' certificates")
				}
				for name, src := range serve.Sources {
					assert.NotContains(t, src.Config["dsn"], "pg-s3cret-value", "bridge serve's DSN of %s", name)
				}
			}
			// No secret value is written into the ConfigMap.
			for _, cm := range r.configMaps {
				for _, s := range st.secrets {
					for k, v := range s {
						if len(v) > 12 && !strings.Contains(v, "BEGIN CERTIFICATE") {
							assert.NotContains(t, cm.Data["bridge.yaml"], v, "%s: the value of Secret key %s", cm.Name, k)
						}
					}
				}
			}
			if tc.check != nil {
				tc.check(t, r, run, serve)
			}
		})
	}
}

// envValue returns the plain value of variable name in d's container.
func envValue(t *testing.T, d *appsv1.Deployment, name string) string {
	t.Helper()
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// requireDoorsClosed checks the configuration a pod runs with: no rows
// or buttons beyond loopback without authentication, NATS with
// credentials, feeds only with JWTs.
func requireDoorsClosed(t *testing.T, cfg *config.Config, what string) {
	t.Helper()
	requireConsoleClosedUnlessJWT(t, cfg, what)
	if cfg.Serve.Listen != "" && !config.IsLoopback(cfg.Serve.Listen) {
		assert.NotEqual(t, config.AuthNone, cfg.Serve.EffectiveMode(), "%s: feeds beyond loopback without authentication", what)
	}
	n := cfg.NATS
	assert.True(t, n.Creds != "" || n.NKeySeedFile != "" || n.User != "" || n.Token != "", "%s: NATS without credentials", what)
	assert.False(t, n.TLS.InsecureSkipVerify, "%s: NATS TLS unverified", what)
}

// requireConsoleClosedUnlessJWT: the console beyond loopback is served only
// behind JWTs (and then over TLS unless the values said a proxy does it).
func requireConsoleClosedUnlessJWT(t *testing.T, cfg *config.Config, what string) {
	t.Helper()
	if cfg.HTTP.Console && cfg.Serve.EffectiveMode() == config.AuthJWT {
		assert.Empty(t, app.ConsoleOff(cfg), "%s", what)
		return
	}
	requireConsoleClosed(t, cfg, what)
}

// checkRendered checks how the objects fit together: the Services and the
// PodDisruptionBudget select the right pods, the ServiceMonitor the
// Service, every Secret the chart renders holds the keys the pods take.
func checkRendered(t *testing.T, r *rendered) {
	t.Helper()
	pods := func(d *appsv1.Deployment) map[string]string {
		require.True(t, selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels), "%s: its selector matches its pods", d.Name)
		return d.Spec.Template.Labels
	}
	bridgePods := pods(r.bridge)
	svc, ok := r.services[r.fullname]
	require.True(t, ok, "Service %s", r.fullname)
	assert.True(t, selects(svc.Spec.Selector, bridgePods), "the Service selects bridge run's pods")
	assert.Equal(t, corev1.ServiceTypeClusterIP, svc.Spec.Type)
	assert.Equal(t, intstr.FromString("http"), svc.Spec.Ports[0].TargetPort)
	if r.serve != nil {
		servePods := pods(r.serve)
		assert.False(t, selects(svc.Spec.Selector, servePods), "the bridge Service does not select the feeds' pods")
		fs, ok := r.services[r.serveName]
		require.True(t, ok, "Service %s", r.serveName)
		assert.True(t, selects(fs.Spec.Selector, servePods))
		assert.False(t, selects(fs.Spec.Selector, bridgePods), "the feeds' Service does not select bridge run's pods")
		assert.Equal(t, intstr.FromString("feeds"), fs.Spec.Ports[0].TargetPort)
	}
	if r.pdb != nil {
		assert.True(t, selects(r.pdb.Spec.Selector.MatchLabels, bridgePods))
		if r.serve != nil {
			assert.False(t, selects(r.pdb.Spec.Selector.MatchLabels, r.serve.Spec.Template.Labels))
		}
		require.NotNil(t, r.pdb.Spec.MaxUnavailable, "maxUnavailable, so that a single replica never blocks a drain")
		assert.GreaterOrEqual(t, r.pdb.Spec.MaxUnavailable.IntValue(), 1)
	}
	if r.monitor != nil {
		assert.True(t, selects(r.monitor.Spec.Selector.MatchLabels, svc.Labels), "the ServiceMonitor selects the Service")
		assert.Equal(t, []string{helmNamespace}, r.monitor.Spec.NamespaceSelector.MatchNames)
		assert.Equal(t, "http", r.monitor.Spec.Endpoints[0].Port)
		assert.Equal(t, "bridge", svc.Labels[r.monitor.Spec.JobLabel], "the job is bridge, as BridgeDown expects")
	}
	require.NotNil(t, r.sa)
	assert.Equal(t, r.sa.Name, r.bridge.Spec.Template.Spec.ServiceAccountName)
	assert.False(t, r.sa.AutomountServiceAccountToken == nil || *r.sa.AutomountServiceAccountToken)
	for name, s := range r.secrets {
		assert.Empty(t, s.Data, "%s: stringData only", name)
	}
}

func TestHelmChartRefusesOpenDoors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, values, want string }{
		{"public feeds without auth", `serve: {enabled: true, tls: {enabled: true, secretName: x}}`,
			"serve.enabled: the feeds serve every row to whoever reaches the Service: set auth.jwt"},
		{"public feeds without auth, plaintext", `serve: {enabled: true, allowPlaintext: true}`,
			"serve.enabled: the feeds serve every row"},
		{"feeds without TLS", `{serve: {enabled: true}, auth: {jwt: {jwksUrl: "https://idp.example.com/jwks.json"}}}`,
			"serve.enabled: tokens and rows would cross the network in clear"},
		{"console without auth", `http: {console: {enabled: true, allowPlaintext: true}}`,
			"http.console.enabled: the web console shows rows"},
		{"console without TLS", `{http: {console: {enabled: true}}, auth: {jwt: {hs256SecretKey: k}}}`,
			"http.console.enabled: tokens and rows would cross the network in clear"},
		{"two JWT keys", `auth: {jwt: {hs256SecretKey: k, jwksUrl: "https://idp.example.com/jwks.json"}}`,
			"auth.jwt: set one of"},
		{"JWKS over http", `auth: {jwt: {jwksUrl: "http://idp.example.com/jwks.json"}}`,
			"auth.jwt.jwksUrl: \"http://idp.example.com/jwks.json\" must be https"},
		{"replicas without a fleet", `replicaCount: 2`,
			"replicaCount: 2 replicas would read one replication slot"},
		{"fleet on the embedded server", `{fleet: {enabled: true}, config: {bridge: {nats: {url: ""}}}}`,
			"fleet.enabled: the members share their leases"},
		{"TLS without its Secret", `nats: {tls: {enabled: true}}`,
			"nats.tls.secretName: nats.tls.enabled needs the Secret"},
		{"a source without a DSN", `config: {bridge: {sources: {orders: {type: pgoutput, config: {slot: s, publication: p}}}}}`,
			"postgres.dsn.orders: the source orders has no DSN"},
		{"a source the environment cannot reach", `{config: {bridge: {sources: {Orders: {type: pgoutput}}}}, postgres: {dsn: {Orders: {key: k}}}}`,
			"config.bridge.sources.Orders: name it with lowercase letters"},
		{"a DSN for no source", `postgres: {dsn: {shpo: {key: pg-dsn}}}`,
			"postgres.dsn.shpo: config.bridge.sources has no source shpo"},
		{"unknown NATS auth", `nats: {auth: {type: anonymous}}`,
			"at '/nats/auth/type': value must be one of 'creds', 'nkey', 'userPassword', 'token', 'none'"},
		// values.schema.json: a misspelt value cannot silently leave a
		// door as it was.
		{"a misspelt value", `http: {token: {enabld: true}}`,
			"additional properties 'enabld' not allowed"},
		{"a value of the wrong type", `http: {console: {enabled: "no"}}`,
			"at '/http/console/enabled': got string, want boolean"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := renderChart(t, chartValues(t, tc.values))
			require.Error(t, err, "rendered")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestBinaryLinksNoHelm: the Helm SDK, kubeconform and the Kubernetes API
// types are test dependencies of this package only; the bridge binary
// links none of them.
func TestBinaryLinksNoHelm(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "../cmd/bridge").Output()
	require.NoError(t, err, "go list -deps ./cmd/bridge")
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/bridgecdc/bridge/bridge/app", "the list holds the binary's packages")
	for _, p := range deps {
		for _, heavy := range []string{"helm.sh/", "k8s.io/", "sigs.k8s.io/", "github.com/yannh/kubeconform"} {
			assert.False(t, strings.HasPrefix(p, heavy), "the binary links %s", p)
		}
	}
}

// TestHelmValuesDocumented: every value of values.yaml is in the values
// table of deploy/README.md, so a value added to the chart is documented.
// A row documents a value when its first cell names it, a path above it
// (`resources`), or its parent path and its own name (`nats.auth.credsKey`,
// `nkeyKey`).
func TestHelmValuesDocumented(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	require.NoError(t, err)
	var vals map[string]any
	require.NoError(t, sigsyaml.Unmarshal(raw, &vals))
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "### Values\n")
	require.True(t, ok, "deploy/README.md has no ### Values")
	section, _, _ = strings.Cut(section, "\n## ")
	var cells []string
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "| `") {
			cells = append(cells, strings.Split(line, "|")[1])
		}
	}
	require.NotEmpty(t, cells)
	documented := func(path []string) bool {
		for _, c := range cells {
			for i := 1; i <= len(path); i++ {
				if strings.Contains(c, "`"+strings.Join(path[:i], ".")+"`") {
					return true
				}
			}
			if len(path) > 1 {
				parent, leaf := strings.Join(path[:len(path)-1], "."), path[len(path)-1]
				if strings.Contains(c, "`"+parent+".") && (strings.Contains(c, "`"+leaf+"`") || strings.Contains(c, "."+leaf+"`")) {
					return true
				}
			}
		}
		return false
	}
	var walk func(path []string, v any)
	n := 0
	walk = func(path []string, v any) {
		if m, ok := v.(map[string]any); ok && len(m) > 0 && !documented(path) {
			for k, sub := range m {
				walk(append(append([]string{}, path...), k), sub)
			}
			return
		}
		n++
		assert.True(t, documented(path), "values.yaml's %s is not in deploy/README.md's values table", strings.Join(path, "."))
	}
	for k, v := range vals {
		walk([]string{k}, v)
	}
	assert.Greater(t, n, 30, "values checked")
}
