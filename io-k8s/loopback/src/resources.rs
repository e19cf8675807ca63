//! The resource types the loopback serves, and the discovery documents that describe them.

use serde_json::{json, Value};

/// One served resource type (a row of discovery).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version inside the group.
    pub version: &'static str,
    /// Kind of one object.
    pub kind: &'static str,
    /// Plural resource name used in URLs.
    pub plural: &'static str,
    /// Singular name (discovery).
    pub singular: &'static str,
    /// Short names kubectl accepts.
    pub short_names: &'static [&'static str],
    /// Subresources served (`status`, `exec`).
    pub subresources: &'static [&'static str],
}

impl ResourceType {
    /// `apiVersion` of its objects: `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Kind of its lists.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// `plural` or `plural.group`, the name RBAC and error messages use.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Whether objects of this type carry a `status` subresource (status ignored on create and
    /// main-resource updates).
    pub fn has_status(&self) -> bool {
        self.subresources.contains(&"status")
    }
}

/// Group of the agent-sandbox core API.
pub const AGENTS_GROUP: &str = "agents.x-k8s.io";
/// Group of the agent-sandbox extensions API (claims, warm pools, templates).
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";

/// `v1` Pod.
pub const PODS: ResourceType = ResourceType {
    group: "",
    version: "v1",
    kind: "Pod",
    plural: "pods",
    singular: "pod",
    short_names: &["po"],
    subresources: &["status", "exec"],
};
/// `coordination.k8s.io/v1` Lease.
pub const LEASES: ResourceType = ResourceType {
    group: "coordination.k8s.io",
    version: "v1",
    kind: "Lease",
    plural: "leases",
    singular: "lease",
    short_names: &[],
    subresources: &[],
};
/// `agents.x-k8s.io/v1beta1` Sandbox.
pub const SANDBOXES: ResourceType = ResourceType {
    group: AGENTS_GROUP,
    version: "v1beta1",
    kind: "Sandbox",
    plural: "sandboxes",
    singular: "sandbox",
    short_names: &["sandbox"],
    subresources: &["status"],
};
/// `extensions.agents.x-k8s.io/v1beta1` SandboxClaim.
pub const SANDBOX_CLAIMS: ResourceType = ResourceType {
    group: EXTENSIONS_GROUP,
    version: "v1beta1",
    kind: "SandboxClaim",
    plural: "sandboxclaims",
    singular: "sandboxclaim",
    short_names: &["sandboxclaim"],
    subresources: &["status"],
};
/// `extensions.agents.x-k8s.io/v1beta1` SandboxWarmPool.
pub const SANDBOX_WARM_POOLS: ResourceType = ResourceType {
    group: EXTENSIONS_GROUP,
    version: "v1beta1",
    kind: "SandboxWarmPool",
    plural: "sandboxwarmpools",
    singular: "sandboxwarmpool",
    short_names: &["swp"],
    subresources: &["status"],
};
/// `extensions.agents.x-k8s.io/v1beta1` SandboxTemplate.
pub const SANDBOX_TEMPLATES: ResourceType = ResourceType {
    group: EXTENSIONS_GROUP,
    version: "v1beta1",
    kind: "SandboxTemplate",
    plural: "sandboxtemplates",
    singular: "sandboxtemplate",
    short_names: &[],
    subresources: &[],
};

/// Every served type, in discovery order. All are namespaced.
pub const ALL: &[ResourceType] = &[
    PODS,
    LEASES,
    SANDBOXES,
    SANDBOX_CLAIMS,
    SANDBOX_WARM_POOLS,
    SANDBOX_TEMPLATES,
];

/// Finds the type served at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<ResourceType> {
    ALL.iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds the type of an `apiVersion` + `kind` pair.
pub fn find_kind(api_version: &str, kind: &str) -> Option<ResourceType> {
    ALL.iter()
        .copied()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `GET /version`.
pub fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-loopback",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `GET /api`.
pub fn core_versions() -> Value {
    json!({
        "kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]
    })
}

/// Which agent-sandbox release the loopback's API server serves (the API groups and versions
/// of its CRDs, agent-sandbox `k8s/crds/*.yaml` by tag).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AgentSandboxApi {
    /// v0.5.0 on: `v1beta1` served and stored (`v1alpha1`, deprecated, is not modelled).
    #[default]
    V1beta1,
    /// v0.4.x and earlier: `v1alpha1` only. Discovery lists `v1alpha1`; no agent-sandbox
    /// resource is served (the loopback models no `v1alpha1` object), so every `v1beta1` request
    /// is the API server's 404, as on such a cluster.
    V1alpha1Only,
    /// Not installed: neither group exists.
    Absent,
}

impl AgentSandboxApi {
    /// Whether a resource of `group/version` is served.
    pub fn serves(self, group: &str, version: &str) -> bool {
        if group != AGENTS_GROUP && group != EXTENSIONS_GROUP {
            return true;
        }
        self == AgentSandboxApi::V1beta1 && version == "v1beta1"
    }

    /// The version discovery lists for agent-sandbox `group` (`version` for any other group).
    fn discovered(self, group: &str, version: &'static str) -> Option<&'static str> {
        if group != AGENTS_GROUP && group != EXTENSIONS_GROUP {
            return Some(version);
        }
        match self {
            AgentSandboxApi::V1beta1 => Some(version),
            AgentSandboxApi::V1alpha1Only => Some("v1alpha1"),
            AgentSandboxApi::Absent => None,
        }
    }
}

fn groups(api: AgentSandboxApi) -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in ALL.iter().filter(|r| !r.group.is_empty()) {
        let Some(v) = api.discovered(r.group, r.version) else {
            continue;
        };
        if !out.contains(&(r.group, v)) {
            out.push((r.group, v));
        }
    }
    out
}

/// `GET /apis`.
pub fn group_list(api: AgentSandboxApi) -> Value {
    let groups: Vec<Value> = groups(api)
        .into_iter()
        .map(|(g, v)| {
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/{group}` (one APIGroup), if served.
pub fn group(group: &str, api: AgentSandboxApi) -> Option<Value> {
    let (g, v) = groups(api).into_iter().find(|(g, _)| *g == group)?;
    let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
    Some(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": [gv.clone()], "preferredVersion": gv}),
    )
}

/// `GET /api/v1` or `GET /apis/{group}/{version}`, if served.
pub fn resource_list(group: &str, version: &str, api: AgentSandboxApi) -> Option<Value> {
    if !api.serves(group, version) {
        return None;
    }
    let mut resources = Vec::new();
    for r in ALL
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({
            "name": r.plural, "singularName": r.singular, "namespaced": true, "kind": r.kind,
            "verbs": VERBS, "shortNames": r.short_names,
        }));
        for sub in r.subresources {
            let verbs: &[&str] = if *sub == "exec" {
                &["create", "get"]
            } else {
                &["get", "patch", "update"]
            };
            resources.push(json!({
                "name": format!("{}/{}", r.plural, sub), "singularName": "", "namespaced": true,
                "kind": if *sub == "exec" { "PodExecOptions" } else { r.kind }, "verbs": verbs,
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

#[cfg(test)]
mod install_tests {
    use super::*;

    fn versions(doc: &Value, group: &str) -> Vec<String> {
        doc["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["name"] == group)
            .flat_map(|g| g["versions"].as_array().unwrap().clone())
            .map(|v| v["version"].as_str().unwrap().to_string())
            .collect()
    }

    /// An older install lists `v1alpha1` and serves no `v1beta1`; no install lists neither
    /// group; the core groups are unaffected either way.
    #[test]
    fn the_agent_sandbox_release_decides_what_is_discovered_and_served() {
        let new = group_list(AgentSandboxApi::V1beta1);
        assert_eq!(versions(&new, EXTENSIONS_GROUP), ["v1beta1"]);
        let old = group_list(AgentSandboxApi::V1alpha1Only);
        assert_eq!(versions(&old, AGENTS_GROUP), ["v1alpha1"]);
        assert_eq!(versions(&old, EXTENSIONS_GROUP), ["v1alpha1"]);
        assert!(!AgentSandboxApi::V1alpha1Only.serves(AGENTS_GROUP, "v1beta1"));
        assert!(resource_list(AGENTS_GROUP, "v1beta1", AgentSandboxApi::V1alpha1Only).is_none());
        let none = group_list(AgentSandboxApi::Absent);
        assert!(versions(&none, AGENTS_GROUP).is_empty());
        assert_eq!(versions(&none, "coordination.k8s.io"), ["v1"]);
        assert!(AgentSandboxApi::Absent.serves("", "v1"));
    }
}
