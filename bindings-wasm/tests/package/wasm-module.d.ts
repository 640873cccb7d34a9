// What a bundler's file loader gives for an imported .wasm: its URL.
declare module "*.wasm" {
  const url: string;
  export default url;
}
