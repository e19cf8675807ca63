//! Which container an exec runs in: the API server's rule, applied before the server does.
//!
//! kubernetes `pkg/registry/core/pod/strategy.go` (`streamLocation`): a named container must be
//! one of the pod's; with none named, the server takes the pod's only container and answers
//! 400 when the pod has none or several ("a container name must be specified for pod P, choose
//! one of: [a b]"). kubectl's "first container" default is the client's, not the server's, so
//! a pod with any ordinary sidecar refuses every unnamed exec.
//!
//! kube-rs passes on a refused exec upgrade as its bare status code (the server's Status body
//! is not read), so the backend words the refusal itself from the pod by this rule, and checks
//! a pod template by it before any pod exists.

use k8s_openapi::api::core::v1::PodSpec;

/// The container an exec into a pod with `spec` runs in, or the API server's refusal, worded
/// as the server words it (`pod` is the pod's name in the message).
pub(crate) fn exec_container(
    spec: &PodSpec,
    pod: &str,
    asked: Option<&str>,
) -> Result<String, String> {
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    match asked {
        Some(c) if names.contains(&c) => Ok(c.to_string()),
        Some(c) => Err(format!("container {c} is not valid for pod {pod}")),
        None if names.len() == 1 => Ok(names[0].to_string()),
        None if names.is_empty() => {
            Err(format!("a container name must be specified for pod {pod}"))
        }
        None => {
            let mut message = format!(
                "a container name must be specified for pod {pod}, choose one of: [{}]",
                names.join(" ")
            );
            let init: Vec<&str> = spec
                .init_containers
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect();
            if !init.is_empty() {
                message += &format!(" or one of the init containers: [{}]", init.join(" "));
            }
            Err(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;

    fn spec(names: &[&str]) -> PodSpec {
        PodSpec {
            containers: names
                .iter()
                .map(|n| Container {
                    name: n.to_string(),
                    ..Container::default()
                })
                .collect(),
            ..PodSpec::default()
        }
    }

    #[test]
    fn the_server_takes_the_only_container_and_wants_a_name_among_several() {
        assert_eq!(exec_container(&spec(&["main"]), "p", None).unwrap(), "main");
        assert_eq!(
            exec_container(&spec(&["main", "proxy"]), "p", None).unwrap_err(),
            "a container name must be specified for pod p, choose one of: [main proxy]"
        );
        assert_eq!(
            exec_container(&spec(&["main", "proxy"]), "p", Some("proxy")).unwrap(),
            "proxy"
        );
        assert_eq!(
            exec_container(&spec(&["main"]), "p", Some("side")).unwrap_err(),
            "container side is not valid for pod p"
        );
        let mut with_init = spec(&["a", "b"]);
        with_init.init_containers = Some(spec(&["setup"]).containers);
        assert!(exec_container(&with_init, "p", None)
            .unwrap_err()
            .ends_with(" or one of the init containers: [setup]"));
    }
}
