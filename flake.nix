{
  description = "rftstack: Trinity-RFT serve mode (vLLM + verl + torch) from uv.lock, for NVIDIA driver 570 (CUDA 12.8) and >= 580 (CUDA 13)";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
    pyproject-nix = {
      url = "github:pyproject-nix/pyproject.nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    uv2nix = {
      url = "github:pyproject-nix/uv2nix";
      inputs.pyproject-nix.follows = "pyproject-nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    pyproject-build-systems = {
      url = "github:pyproject-nix/build-system-pkgs";
      inputs.pyproject-nix.follows = "pyproject-nix";
      inputs.uv2nix.follows = "uv2nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  # Logic lives in nix/ (outputs, python sets, wrappers, checks) and overlays/.
  outputs = inputs: import ./nix/outputs.nix inputs;
}
