//! The OpenAPI v3 documents kubectl consults before writing: an index (`/openapi/v3`) and one
//! document per group-version whose PATCH operations carry the `x-kubernetes-group-version-kind`
//! extension and the `fieldValidation` query parameter, so kubectl validates on the server side
//! (`fieldValidation=Strict`) instead of downloading schemas. No schemas are served.

use serde_json::{json, Map, Value};

use crate::resources::{self, ResourceType};

fn gv_path(r: &ResourceType) -> String {
    if r.group.is_empty() {
        format!("api/{}", r.version)
    } else {
        format!("apis/{}/{}", r.group, r.version)
    }
}

/// `GET /openapi/v3`.
pub fn index() -> Value {
    let mut paths = Map::new();
    for r in resources::ALL {
        let p = gv_path(r);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=LOOPBACK")}),
        );
    }
    json!({"paths": paths})
}

/// `GET /openapi/v3/<api/v1 | apis/group/version>`, if served.
pub fn group_version(path: &str) -> Option<Value> {
    let mut paths = Map::new();
    for r in resources::ALL.iter().filter(|r| gv_path(r) == path) {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        ]);
        let op = |id: &str| json!({"operationId": format!("{id}{}", r.kind), "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": {"200": {"description": "OK"}}});
        let base = format!("/{}/namespaces/{{namespace}}/{}", gv_path(r), r.plural);
        paths.insert(
            base.clone(),
            json!({"post": op("create"), "get": op("list")}),
        );
        paths.insert(format!("{base}/{{name}}"), json!({"patch": op("patch"), "put": op("replace"), "get": op("read"), "delete": op("delete")}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0-loopback"},
        "paths": paths, "components": {"schemas": {}},
    }))
}
